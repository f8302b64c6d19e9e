"""ReMax's baseline rollout: one greedy episode per task, played by the ordinary rollout engine.

ReMax (arXiv 2310.10505) subtracts from each sampled response's reward the reward of the greedy response to the
same prompt (the reference generates it with ``do_sample=False``, ``verl/trainer/ppo/ray_trainer.py:1192-1206``).
In a multi-agent episode the "greedy response" is a whole greedy episode: :func:`greedy_rollout` calls
:func:`~drmas_train.collect.rollout.rollout` on the same tasks with one episode per task and temperature 0, and
renames each greedy episode's ``uid`` to the ``uid`` of its task in the sampled batch, so the baseline of a call
is looked up by its own ids (:func:`drmas_train.algorithm.advantages.greedy_baseline`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from drmas_train.backends.base import SamplingParams
from drmas_train.collect.rollout import RolloutResult, rollout
from drmas_train.model.assignment import ModelPool

__all__ = ["greedy_rollout"]


def greedy_rollout(
    env_fn: Callable[[], Any] | str,
    tasks: Sequence[Any],
    pool: ModelPool,
    sampling: SamplingParams,
    sampled: RolloutResult,
    *,
    seed: int,
    **rollout_kwargs: Any,
) -> RolloutResult:
    """Play one greedy (temperature 0) episode per task of ``sampled`` and give it that task's ``uid``.

    Args:
        env_fn, tasks, pool: as for :func:`~drmas_train.collect.rollout.rollout`; ``tasks`` must be the task list
            ``sampled`` was played on, in the same order.
        sampling: the sampled rollout's parameters; the greedy rollout uses them with ``temperature=0``.
        sampled: the sampled rollout (G episodes per task, trajectories in task order).
        seed, rollout_kwargs: passed to ``rollout`` (``max_prompt_tokens``, ``truncation``, ``progress``).

    Returns:
        the greedy :class:`~drmas_train.collect.rollout.RolloutResult` (N samples' worth of episodes), its samples
        and trajectories carrying the sampled batch's ``uid`` of their task and ``traj_uid`` ``f"{uid}/greedy"``.

    Raises:
        ValueError: ``sampled`` holds a different number of prompt groups than ``tasks``; ``rollout``'s errors.
    """
    greedy = rollout(env_fn, tasks, 1, pool, sampling.replace(temperature=0.0), seed=seed, **rollout_kwargs)
    task_uids = list(
        dict.fromkeys(t.uid for t in sampled.trajectories)
    )  # task order (trajectories are task-major)
    if len(task_uids) != len(greedy.trajectories):
        raise ValueError(f"the sampled rollout has {len(task_uids)} prompt groups but {len(greedy.trajectories)} tasks "
                         "were given; pass the task list the sampled rollout was played on")  # fmt: skip
    rename = {t.uid: u for t, u in zip(greedy.trajectories, task_uids, strict=True)}
    return RolloutResult(
        [
            dataclasses.replace(s, uid=rename[s.uid], traj_uid=f"{rename[s.uid]}/greedy")
            for s in greedy.samples
        ],
        [
            dataclasses.replace(t, uid=rename[t.uid], traj_uid=f"{rename[t.uid]}/greedy")
            for t in greedy.trajectories
        ],
        greedy.timing,
    )
