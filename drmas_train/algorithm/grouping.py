"""Which agent calls share a baseline: the grouping axis of the group-baseline advantage estimators.

Every group-baseline estimator of :mod:`drmas_train.algorithm.advantages` takes ``grouping=`` (``None`` = the
estimator's own default) and reduces the batch to **units** (one value each) in **groups** (one baseline each):

* ``prompt``: group key ``uid``; a unit is a trajectory, valued at the mean of its calls' scores (GRPO; the
  reference without ``group_by_agent_id``, ``verl/trainer/ppo/core_algos.py:538-550``).
* ``prompt_call``: group key ``uid``; a unit is a call, all agents pooled (the global step-level ablation).
* ``prompt_agent``: group key (``uid``, ``agent_id``); a unit is a call (Dr. MAS, arXiv 2602.08847 Eq. (5); the
  reference's ``group_by_agent_id``, ``verl/trainer/ppo/ray_trainer.py:269-271``).
* ``prompt_agent_turn``: group key (``uid``, ``agent_id``, ``turn``); a unit is a call (AT-GRPO, arXiv 2510.11062;
  ``turn`` is the agent's own call index, ``Sample.agent_turn``).

Each row (call) gets the advantage of its unit: with ``prompt`` every call of a trajectory gets the trajectory's.

Shapes: **B** rows (calls), **U** units, **K** groups; id columns are (B,) arrays or sequences of hashable values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["GROUPINGS", "POOLED_GROUPINGS", "Units", "check_grouping", "group_index", "group_key", "group_stats", "units"]

#: accepted ``grouping`` values (see the module doc).
GROUPINGS = ("prompt", "prompt_call", "prompt_agent", "prompt_agent_turn")

#: groupings whose statistics pool the agents of a prompt group, so possibly of several models.
POOLED_GROUPINGS = ("prompt", "prompt_call")


def check_grouping(grouping: str | None, default: str) -> str:
    """``grouping``, or ``default`` when it is ``None``.

    Raises:
        ValueError: ``grouping`` not in :data:`GROUPINGS` (the message lists them).
    """
    g = default if grouping is None else grouping
    if g not in GROUPINGS:
        raise ValueError(
            f"grouping must be one of {list(GROUPINGS)} or None (the estimator's default), got {grouping!r}"
        )
    return g


def group_index(*keys: Sequence[Any] | np.ndarray) -> np.ndarray:
    """Dense group id (B,) int64 of each row for the composite key ``keys`` (each a (B,) column).

    Rows with equal values in every column share an id; ids are ``0..n_groups-1``.

    Raises:
        ValueError: no key, or columns of different lengths.
    """
    if not keys:
        raise ValueError("group_index needs at least one key column")
    n = len(keys[0])
    codes = np.zeros(n, dtype=np.int64)
    for col in keys:
        if len(col) != n:
            raise ValueError(f"key columns differ in length: {n} vs {len(col)}")
        # np.unique over object arrays needs orderable values; map to str to mix ints/strs safely.
        _, inv = np.unique(np.asarray([str(v) for v in col], dtype=object).astype(str), return_inverse=True)
        codes = codes * (int(inv.max(initial=0)) + 1) + inv.reshape(-1)
        _, codes = np.unique(codes, return_inverse=True)  # re-densify so the product never overflows
        codes = codes.reshape(-1).astype(np.int64)
    return codes


def group_stats(
    values: np.ndarray, groups: np.ndarray, *, unbiased: bool = True, weight: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-group (count, mean, std) of ``values`` (B,) float64 grouped by dense ids ``groups`` (B,) int.

    Rows with ``weight == 0`` (a (B,) bool/0-1 array; default all 1) are left out. Two-pass: the std is taken
    over deviations from the group mean, so identical values give std exactly 0 up to one rounding of the mean.
    A group with fewer than 2 members (or 1 with ``unbiased=False`` is fine) has std 0; an empty group has mean 0.

    Returns:
        count (n_groups,) int64, mean (n_groups,) float64, std (n_groups,) float64.
    """
    w = np.ones(len(values)) if weight is None else np.asarray(weight, dtype=np.float64)
    v = np.where(w > 0, np.asarray(values, dtype=np.float64), 0.0)
    n_groups = int(groups.max(initial=-1)) + 1
    count = np.bincount(groups, weights=w, minlength=n_groups)
    mean = np.bincount(groups, weights=v * w, minlength=n_groups) / np.maximum(count, 1)
    dev = (v - mean[groups]) * w
    ddof = 1 if unbiased else 0
    var = np.bincount(groups, weights=dev * dev, minlength=n_groups) / np.maximum(count - ddof, 1)
    std = np.where(count - ddof > 0, np.sqrt(var), 0.0)
    return count.astype(np.int64), mean, std


@dataclasses.dataclass(frozen=True)
class Units:
    """The batch reduced to units in groups (see the module doc).

    Attributes:
        row_unit: (B,) int64, the unit of each row.
        group: (U,) int64, the dense group id of each unit (``0..K-1``).
        value: (U,) float64, each unit's value (0 where not ``valid``).
        valid: (U,) bool, units with at least one valid row.
        key: the group-key columns (each (B,)), as :func:`group_index` took them.
    """

    row_unit: np.ndarray
    group: np.ndarray
    value: np.ndarray
    valid: np.ndarray
    key: tuple[Any, ...]

    def to_rows(self, unit_values: np.ndarray, valid_rows: np.ndarray) -> np.ndarray:
        """(B,) float64: each valid row gets its unit's entry of ``unit_values`` (U,), other rows 0."""
        return np.where(valid_rows, np.asarray(unit_values, dtype=np.float64)[self.row_unit], 0.0)


def group_key(grouping: str, *, uid: Any, agent_id: Any, turn: Any) -> tuple[Any, ...]:
    """The (B,) key columns of ``grouping``'s groups: ``(uid,)``, ``(uid, agent_id)`` or ``(uid, agent_id, turn)``."""
    if grouping in ("prompt", "prompt_call"):
        return (uid,)
    if grouping == "prompt_agent":
        return (uid, agent_id)
    return (uid, agent_id, turn)


def units(
    grouping: str,
    scores: np.ndarray,
    valid: np.ndarray,
    *,
    uid: Any,
    agent_id: Any,
    traj_uid: Any = None,
    turn: Any = None,
) -> Units:
    """Units and groups of the batch under ``grouping`` (one of :data:`GROUPINGS`).

    Args:
        scores: (B,) float64. valid: (B,) bool, rows that take part (the others neither count nor get a value).
        uid, agent_id: (B,) ids. traj_uid: (B,) ids, needed by ``prompt``. turn: (B,) ints, needed by
            ``prompt_agent_turn``.

    Raises:
        ValueError: unknown ``grouping``, or a column it needs is None.
    """
    check_grouping(grouping, grouping)
    needs = {"prompt": ("traj_uid", traj_uid), "prompt_agent_turn": ("turn", turn)}.get(grouping)
    if needs is not None and needs[1] is None:
        raise ValueError(f"grouping {grouping!r} needs {needs[0]!r} (a (B,) column), got None")
    key = group_key(grouping, uid=uid, agent_id=agent_id, turn=turn)
    if grouping != "prompt":
        s = np.where(valid, scores, 0.0)
        return Units(np.arange(len(s)), group_index(*key), s, np.asarray(valid, dtype=bool), key)
    traj = group_index(uid, traj_uid)  # (B,) trajectory ids
    count, value, _ = group_stats(scores, traj, unbiased=True, weight=valid)  # the mean of the valid calls' scores
    group = np.zeros(len(count), dtype=np.int64)
    group[traj] = group_index(uid)
    return Units(traj, group, value, count > 0, key)
