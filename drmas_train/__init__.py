"""drmas_train: batched multi-agent LLM rollouts, GRPO and Dr. MAS advantages, PPO updates per model.

The entry points a user needs, at top level (docs/python-api.md, whose example tests/docs/test_python_api.py
runs)::

    import drmas_train

    cfg = drmas_train.load_config("quickstart_math", ["run.iterations=1"])  # a preset + dotted overrides
    summary = drmas_train.train(cfg)  # the training loop; the run summary
    run = drmas_train.evaluate(drmas_train.EvalConfig(envs=["math-solver-verifier-v0"]), "runs/eval")
    tables = drmas_train.build_tables([run])  # the leaderboard, one table per suite

* config: :func:`load_config`, :class:`TrainConfig`, :func:`list_presets`, :class:`ConfigError`;
* training: :func:`train`;
* evaluation: :func:`evaluate`, :class:`EvalConfig`, :func:`load_run`, :class:`RunResult`;
* ranking: :func:`build_tables`, :func:`to_markdown`, :func:`write_leaderboard`;
* registries: :func:`get_estimator` and :func:`list_estimators` (advantage estimators), :func:`list_envs` (the
  env ids of ``drmas_envs``'s registry; make one with ``drmas_envs.make``).

Importing ``drmas_train`` is cheap: each name is imported on first use (PEP 562 ``__getattr__``), so torch,
transformers and Ray load only when a name that needs them is touched (tests/architecture/test_public_api.py checks it).

The package is grouped by the stages of the data flow, one part per floor, bottom first: 0 ``errors``, 1 ``data``,
2 ``model``, 3 ``backends``, 4 ``collect``, 5 ``algorithm``, 6 ``eval``, 7 ``serving``, 8 ``distributed``,
9 ``run``, 10 ``integrations``, 11 ``commands``, 12 ``cli``. Each part imports only its own floor and the ones below
it (docs/architecture.md, "Package layout"; tests/architecture/test_layout.py checks every import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first access).
_LAZY = {
    "ConfigError": "drmas_train.errors",
    "TrainConfig": "drmas_train.run.config",
    "load_config": "drmas_train.run.config",
    "list_presets": "drmas_train.run.config",
    "train": "drmas_train.run.trainer",
    "EvalConfig": "drmas_train.eval.evaluate",
    "evaluate": "drmas_train.eval.evaluate",
    "RunResult": "drmas_train.eval.results",
    "load_run": "drmas_train.eval.results",
    "build_tables": "drmas_train.eval.leaderboard",
    "to_markdown": "drmas_train.eval.leaderboard",
    "write_leaderboard": "drmas_train.eval.leaderboard",
    "get_estimator": "drmas_train.algorithm.advantages",
}

__all__ = [
    "ConfigError",
    "TrainConfig",
    "load_config",
    "list_presets",
    "train",
    "EvalConfig",
    "evaluate",
    "RunResult",
    "load_run",
    "build_tables",
    "to_markdown",
    "write_leaderboard",
    "get_estimator",
    "list_estimators",
    "list_envs",
    "__version__",
]

if TYPE_CHECKING:  # the names as type checkers and IDEs see them
    from drmas_train.algorithm.advantages import get_estimator
    from drmas_train.errors import ConfigError
    from drmas_train.eval.evaluate import EvalConfig, evaluate
    from drmas_train.eval.leaderboard import build_tables, to_markdown, write_leaderboard
    from drmas_train.eval.results import RunResult, load_run
    from drmas_train.run.config import TrainConfig, list_presets, load_config
    from drmas_train.run.trainer import train


def __getattr__(name: str) -> Any:
    """Import a public name on first access (PEP 562); it is then cached in the module's globals.

    Raises:
        AttributeError: ``name`` is not one of ``__all__``.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(
            f"module 'drmas_train' has no attribute {name!r}; public names: {', '.join(__all__)}"
        )
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names, the lazy ones included (what ``dir(drmas_train)`` and tab completion list)."""
    return sorted(__all__)


def list_estimators() -> list[str]:
    """The advantage estimators' names, in registration order, from the registry itself
    (:data:`drmas_train.algorithm.advantages.ESTIMATORS`; ``algorithm.estimator`` accepts each), e.g.
    ``["grpo", "drmas", ...]``; :func:`get_estimator` gives the function of one."""
    from drmas_train.algorithm.advantages import ESTIMATORS

    return list(ESTIMATORS)


def list_envs() -> list[str]:
    """The registered env ids of :data:`drmas_envs.registry`, sorted (``env.id`` accepts each; optional extras such
    as ``games`` are listed even when not installed, and raise when made)."""
    import drmas_envs

    return sorted(drmas_envs.registry)
