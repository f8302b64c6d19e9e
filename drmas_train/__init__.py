"""drmas_train: batched multi-agent LLM rollouts, GRPO and Dr. MAS advantages, PPO updates per model.

The package is grouped by the stages of the data flow (docs/architecture.md): :mod:`~drmas_train.model` →
:mod:`~drmas_train.collect` → :mod:`~drmas_train.algorithm` → :mod:`~drmas_train.run`, with
:mod:`~drmas_train.eval` beside the run. The old flat module paths (``drmas_train.advantages``, ...) still import:
they are aliases of the moved modules (the same module object), see :data:`MOVED_MODULES`.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

#: Old flat module name -> the sub-package it moved to (``drmas_train.<old>`` is ``drmas_train.<stage>.<old>``).
MOVED_MODULES = {
    **dict.fromkeys(["models", "assignment", "tiny_tokenizer", "logprobs", "lm_head", "token_budget"], "model"),
    **dict.fromkeys(["rollout", "samples", "sample_io", "task_sampler", "greedy_rollout"], "collect"),
    **dict.fromkeys(
        ["advantages", "grouping", "sample_advantages", "losses", "update", "optim", "old_logprobs", "memory_budget",
         "precision"],
        "algorithm",
    ),
    **dict.fromkeys(["evaluate", "metrics", "results", "leaderboard", "policies", "baselines"], "eval"),
    **dict.fromkeys(
        [
            "trainer", "config", "checkpoint", "metrics_log", "env_setup", "run_dir", "interrupt", "threads",
            "data_prep", "data_recipes", "updater",
        ],
        "run",
    ),
}  # fmt: skip


class _MovedModuleAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``drmas_train.<old>`` (and its attribute on the package) as the moved module object itself."""

    _specs: dict = {}

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, name = fullname.rpartition(".")
        if pkg != __name__ or name not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        module = importlib.import_module(f"{__name__}.{MOVED_MODULES[name]}.{name}")
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module):
        # Already executed under its new name; the import system set ``__spec__`` to the alias' spec: put back
        # the real one, so ``importlib.reload`` and ``python -m`` keep seeing the module's own file.
        module.__spec__ = self._specs[module.__name__]


if not any(isinstance(f, _MovedModuleAlias) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleAlias())  # first: an editable install's finder may map the old names too
