"""What a training run holds between iterations (:class:`RunState`, built by
:func:`drmas_train.run.trainer.build_run`) and its schedule: the seed every step of an iteration derives from, and
which iterations checkpoint or validate."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from drmas_envs import TaskSource, TextAECEnv
    from drmas_train.algorithm.reward_shaping import FixedKLController
    from drmas_train.collect.task_sampler import TaskSampler
    from drmas_train.model.assignment import ModelPool
    from drmas_train.run.config import TrainConfig
    from drmas_train.run.metrics_log import MetricsLogger
    from drmas_train.run.policy_versions import PolicyVersions
    from drmas_train.run.updater import Updater

__all__ = ["RunState", "iteration_seed", "save_due", "validation_due"]


@dataclasses.dataclass
class RunState:
    """Everything a run holds between iterations. The models' training state (optimizers, frozen references,
    critics) belongs to :attr:`updater`."""

    cfg: TrainConfig
    run_dir: Path
    env_fn: Callable[[], TextAECEnv]
    """a fresh env of ``env.id`` with ``env.kwargs`` (and the run's tasks)."""
    tasks: TaskSource
    """the training tasks."""
    val_tasks: TaskSource | None
    """the held-out tasks of the validation (None: no validation)."""
    pool: ModelPool
    sampler: TaskSampler
    logger: MetricsLogger
    updater: Updater
    """:class:`~drmas_train.run.updater.LocalUpdater` or, on Ray, ``RayUpdater``."""
    versions: PolicyVersions
    """each trained model's update count."""
    start_iteration: int = 0
    elapsed_before: float = 0.0
    """seconds the earlier processes of this run spent (from the checkpoint resumed)."""
    kl_control: FixedKLController | None = None
    """the KL-in-reward coefficient's controller (``algorithm.reward_kl_coef > 0``), else None."""
    async_snapshot: dict[str, Any] | None = None
    """``run.mode: async``: the loop's state at the end of the last step, for checkpoints."""
    env_step: str = "round"
    """the env's ``metadata["reference_env_step"]`` (GiGPO's discounted step returns)."""
    game_envs: dict[str, Callable[[], TextAECEnv]] = dataclasses.field(default_factory=dict)
    """games: validation name (an opponent, or ``self-play``) -> an env factory
    (:func:`~drmas_train.run.env_setup.game_validation_envs`); empty for every other env."""
    started: float = dataclasses.field(default_factory=time.perf_counter)
    """``time.perf_counter()`` at this process's start."""
    stalled_warned: set[str] = dataclasses.field(default_factory=set)
    """models already warned of a stalled update."""

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run so far: earlier processes (up to the checkpoint resumed) + this one."""
        return self.elapsed_before + time.perf_counter() - self.started


def iteration_seed(cfg: TrainConfig, it: int) -> int:
    """The seed of iteration ``it`` (0-based): its rollout's (in async mode, the ``it``-th generated batch's), its
    padding's and its update's."""
    return cfg.seed * 1_000_003 + it


def save_due(cfg: TrainConfig, it: int) -> bool:
    """Whether iteration ``it`` (0-based) ends with a checkpoint (``run.save_every``, and always the last one)."""
    return (cfg.run.save_every > 0 and (it + 1) % cfg.run.save_every == 0) or it + 1 == cfg.run.iterations


def validation_due(cfg: TrainConfig, it: int) -> bool:
    """Whether iteration ``it`` (0-based) ends with a validation (``eval.every``, and always the last one)."""
    return cfg.eval.every > 0 and ((it + 1) % cfg.eval.every == 0 or it + 1 == cfg.run.iterations)
