"""DAPO's dynamic sampling: keep drawing prompt groups until the batch holds enough groups with a reward spread.

A prompt group whose G rollouts all score the same gives every group-baseline estimator a zero advantage: it costs
an update and teaches nothing. DAPO (Yu et al. 2025, arXiv 2503.14476, Sec. 3.2, "dynamic sampling") over-samples
and filters them out; the reference does it in its DAPO trainer (``langfengQ/DrMAS
recipe/dapo/dapo_ray_trainer.py:167-210``, config ``algorithm.filter_groups``): it keeps the groups whose metric has a
non-zero std, or that hold a single trajectory (:179-187), generates another batch while fewer than
``train_batch_size`` groups are kept (up to ``max_num_gen_batches``; it raises when the bound is hit), and cuts the
batch to exactly ``train_batch_size`` groups (:209-210).

:func:`dynamic_sampling` does the same over any rollout function. At its bound it logs a warning and returns the
groups it has (fewer than asked), so a run on hard data keeps going; the metrics say how many batches were drawn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drmas_train.collect.config import FILTER_METRICS
from drmas_train.collect.rollout import RolloutResult, merge_timing

__all__ = ["DynamicBatch", "groups_with_spread", "dynamic_sampling"]

logger = logging.getLogger(__name__)


@dataclass
class DynamicBatch:
    """What :func:`dynamic_sampling` returns.

    Attributes:
        result: the kept groups' samples and trajectories (in draw order), ``timing`` summed over the draws.
        tasks: the task of each kept group, in the same order (what a second rollout of these groups needs,
            e.g. ReMax's greedy baseline).
        metrics: ``rollout/gen_batches`` (rollouts drawn), ``rollout/groups_drawn``, ``rollout/groups_with_spread``
            (kept before the cut to the target) and ``rollout/groups_kept``.
    """

    result: RolloutResult
    tasks: list[Any]
    metrics: dict[str, float] = field(default_factory=dict)


def groups_with_spread(trajectories: Sequence[Any], metric: str) -> list[str]:
    """The ``uid`` s (in first-seen order) whose trajectories' ``metric`` has a non-zero (population) std, or that
    hold one trajectory (the reference's rule, ``recipe/dapo/dapo_ray_trainer.py:183-187``).

    Raises:
        ValueError: ``metric`` not in :data:`FILTER_METRICS`.
    """
    if metric not in FILTER_METRICS:
        raise ValueError(f"filter metric must be one of {list(FILTER_METRICS)}, got {metric!r}")
    by_uid: dict[str, list[float]] = {}
    for t in trajectories:
        by_uid.setdefault(t.uid, []).append(float(getattr(t, metric)))
    return [u for u, vals in by_uid.items() if len(vals) == 1 or np.std(vals) > 0]


def dynamic_sampling(
    draw: Callable[[int], tuple[Sequence[Any], RolloutResult]],
    *,
    target_groups: int,
    metric: str,
    max_batches: int,
) -> DynamicBatch:
    """Draw rollouts until ``target_groups`` prompt groups with a reward spread are kept, then cut to that many.

    Args:
        draw: ``draw(k) -> (tasks, result)``: the ``k``-th rollout (0, 1, ...) of new tasks, its trajectories task-major
            (:func:`~drmas_train.collect.rollout.rollout`'s order) and its ``uid`` s distinct from every other
            draw's.
        target_groups: groups the batch needs (``rollout.batch_size``, >= 1).
        metric: see :data:`FILTER_METRICS`. max_batches: the most rollouts drawn (>= 1).

    Returns:
        the :class:`DynamicBatch`; fewer than ``target_groups`` groups only when ``max_batches`` rollouts were drawn,
        which is logged as a warning.

    Raises:
        ValueError: ``target_groups`` or ``max_batches`` < 1, an unknown ``metric``, or a draw whose groups do not
            match its tasks.
    """
    if target_groups < 1 or max_batches < 1:
        raise ValueError(f"target_groups and max_batches must be >= 1, got {target_groups}, {max_batches}")
    kept_tasks: list[Any] = []
    kept_uids: list[str] = []
    parts: list[RolloutResult] = []
    drawn = 0
    k = 0
    while len(kept_uids) < target_groups and k < max_batches:
        tasks, result = draw(k)
        k += 1
        order = list(dict.fromkeys(t.uid for t in result.trajectories))  # task order
        if len(order) != len(tasks):
            raise ValueError(f"draw {k - 1} returned {len(order)} prompt groups for {len(tasks)} tasks")
        drawn += len(order)
        keep = set(groups_with_spread(result.trajectories, metric))
        for uid, task in zip(order, tasks, strict=True):
            if uid in keep:
                kept_uids.append(uid)
                kept_tasks.append(task)
        parts.append(result)
    with_spread = len(kept_uids)
    if with_spread < target_groups:
        logger.warning("dynamic sampling: %d of %d prompt groups with a reward spread after %d rollouts "
                       "(rollout.filter_groups_max_batches); training on those", with_spread, target_groups, k)  # fmt: skip
    chosen = set(kept_uids[:target_groups])
    timing = merge_timing(p.timing for p in parts)
    merged = RolloutResult(
        [s for p in parts for s in p.samples if s.uid in chosen],
        [t for p in parts for t in p.trajectories if t.uid in chosen],
        timing,
    )
    metrics = {"rollout/gen_batches": float(k), "rollout/groups_drawn": float(drawn),
               "rollout/groups_with_spread": float(with_spread), "rollout/groups_kept": float(len(chosen))}  # fmt: skip
    return DynamicBatch(merged, kept_tasks[:target_groups], metrics)
