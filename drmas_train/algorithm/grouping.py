"""Which agent calls share a baseline, what one unit is, and what it is divided by: the normalisation matrix of the
group-baseline advantage estimators (docs/advantages.md).

Every group-baseline estimator of :mod:`drmas_train.algorithm.advantages` takes ``grouping=`` and ``units=``
(``None`` = the estimator's own / the grouping's own) and reduces the batch to **units** (one value each) in
**groups** (one baseline each). Dr. MAS's Eq. (5) (arXiv 2602.08847) changes two axes of GRPO at once, the group
key and the unit; they are two settings here:

* **grouping** (the group key): ``prompt`` (``uid``) | ``prompt_agent`` (``uid``, ``agent_id``), plus
  ``prompt_call`` (``uid``; the older name of ``prompt`` over calls) and ``prompt_agent_turn`` (``uid``,
  ``agent_id``, ``turn``; AT-GRPO, arXiv 2510.11062, ``turn`` the agent's own call index ``Sample.agent_turn``).
* **units** (:data:`UNITS`): ``trajectory``: a unit is a trajectory's calls *in the group key* averaged into one
  value (unit key (``uid``, ``traj_uid``) under ``prompt``, (``uid``, ``traj_uid``, ``agent_id``) under
  ``prompt_agent``) and every one of those calls gets the unit's advantage; ``call``: each call is a unit with its
  own score. ``None`` = the grouping's own (:data:`DEFAULT_UNITS`: ``trajectory`` for ``prompt``, ``call`` for the
  others). ``prompt_call`` and ``prompt_agent_turn`` accept only ``call`` (a trajectory has one call per
  (agent, turn)).

The 2 x 2 (:data:`CELLS`) and the estimators that are its points (their default grouping, units null):

=====================  ==================================  ==========================================
units, grouping        ``prompt`` (one group per prompt)   ``prompt_agent`` (one per prompt and agent)
=====================  ==================================  ==========================================
``trajectory``         ``grpo`` (GRPO, the reference       ``grouping: prompt_agent, units: trajectory``
                       without ``group_by_agent_id``,      (the cell Eq. (5) skips; no estimator has it
                       ``core_algos.py:538-550``)          as its default)
``call``               ``grpo_step`` (``prompt_call``;     ``drmas`` (Dr. MAS; the reference's
                       ``grouping: prompt, units: call``)  ``group_by_agent_id``, ``ray_trainer.py:269-271``)
=====================  ==================================  ==========================================

With one call per agent per trajectory, ``prompt_agent`` over trajectories equals ``prompt_agent`` over calls;
with one agent, every per-agent cell equals its global twin.

The third axis, the **scale** (:data:`SCALES`), is what the centred value ``v - m`` is divided by
(:func:`drmas_train.algorithm.advantages.normalize_in_groups`):

* ``std``: the group's std, ``(v - m_g) / (s_g + eps)`` (GRPO; the default),
* ``mean``: nothing, ``A = v - m_g`` (Dr. GRPO, arXiv 2503.20783; ``norm_by_std=False`` is this scale),
* ``batch_std``: ``(v - m_g) / (s_batch + eps)``, ``s_batch`` the std of every valid unit's *value* (not of the
  centred values) in the batch, all groups and all agents together (LitePPO, "group-level mean, batch-level std",
  arXiv 2508.08221; implemented as ROLL, that paper's framework, computes it: ``reward_std =
  response_level_rewards.std()`` then ``(rewards - group mean) / (reward_std + 1e-6)``, ``alibaba/ROLL
  roll/utils/functionals.py`` ``reward_norm`` with ``norm_mean_type: group``, ``norm_std_type: batch``; AReaL's
  ``adv_norm: {mean_level: group, std_level: batch}``). Its n-1 follows the estimators' ``unbiased`` flag.

Each row (call) gets the advantage of its unit: with trajectory units every call of the unit gets the unit's.

Shapes: **B** rows (calls), **U** units, **K** groups; id columns are (B,) arrays or sequences of hashable values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "ACCEPTED_UNITS",
    "CELLS",
    "DEFAULT_UNITS",
    "GROUPINGS",
    "POOLED_GROUPINGS",
    "SCALES",
    "UNITS",
    "Units",
    "cell",
    "check_grouping",
    "check_scale",
    "group_index",
    "group_key",
    "group_stats",
    "resolve_scale",
    "resolve_units",
    "units",
]

#: accepted ``grouping`` values (see the module doc).
GROUPINGS = ("prompt", "prompt_call", "prompt_agent", "prompt_agent_turn")

#: accepted ``units`` values: what one normalised value stands for (see the module doc).
UNITS = ("trajectory", "call")

#: grouping -> its units when ``units`` is None.
DEFAULT_UNITS = {"prompt": "trajectory", "prompt_call": "call", "prompt_agent": "call", "prompt_agent_turn": "call"}

#: grouping -> the units it accepts.
ACCEPTED_UNITS = {"prompt": UNITS, "prompt_call": ("call",), "prompt_agent": UNITS, "prompt_agent_turn": ("call",)}

#: (per agent?, units) -> (grouping, units): the 2 x 2 of Dr. MAS's Eq. (5) as settings (the module doc's table).
CELLS: dict[tuple[bool, str], tuple[str, str]] = {
    (False, "trajectory"): ("prompt", "trajectory"),
    (False, "call"): ("prompt", "call"),
    (True, "trajectory"): ("prompt_agent", "trajectory"),
    (True, "call"): ("prompt_agent", "call"),
}

#: accepted scales (see the module doc); the first is the default.
SCALES = ("std", "mean", "batch_std")

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


def resolve_units(grouping: str, units: str | None) -> str:
    """The units of a run under ``grouping`` (checked): ``units``, or the grouping's own (:data:`DEFAULT_UNITS`).

    Raises:
        ValueError: unknown ``grouping``; ``units`` not in :data:`UNITS`, or not one ``grouping`` accepts
            (``prompt_call`` and ``prompt_agent_turn``: only ``call``); the message lists the accepted ones.
    """
    g = check_grouping(grouping, grouping)
    if units is None:
        return DEFAULT_UNITS[g]
    if units not in ACCEPTED_UNITS[g]:
        raise ValueError(f"units must be one of {list(ACCEPTED_UNITS[g])} or None (the grouping's own, "
                         f"{DEFAULT_UNITS[g]!r}) under grouping {g!r}, got {units!r}")  # fmt: skip
    return units


def cell(grouping: str, units: str | None = None) -> tuple[bool, str]:
    """(per agent?, units) of ``grouping`` with ``units``: ``cell("prompt_agent", "trajectory") == (True,
    "trajectory")``, ``cell("prompt_call") == (False, "call")`` (``prompt_agent_turn``: per agent, calls).

    Raises:
        ValueError: as :func:`resolve_units`.
    """
    u = resolve_units(grouping, units)
    return grouping in ("prompt_agent", "prompt_agent_turn"), u


def check_scale(scale: str) -> str:
    """``scale``, checked.

    Raises:
        ValueError: ``scale`` not in :data:`SCALES` (the message lists them).
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}")
    return scale


def resolve_scale(scale: str | None, norm_by_std: bool) -> str:
    """The scale a run uses: ``scale``, or, when it is ``None``, the one ``norm_by_std`` names (True: ``std``,
    False: ``mean``; ``norm_by_std`` is the older spelling of these two scales).

    Raises:
        ValueError: ``scale`` not in :data:`SCALES`, or ``norm_by_std=False`` with a scale other than ``mean``
            (the two settings contradict each other).
    """
    if scale is None:
        return "std" if norm_by_std else "mean"
    check_scale(scale)
    if not norm_by_std and scale != "mean":
        raise ValueError(f"norm_by_std=False means scale='mean', but scale={scale!r}; set only the scale")
    return scale


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
    units: str | None = None,
) -> Units:
    """Units and groups of the batch under ``grouping`` (one of :data:`GROUPINGS`) and ``units``.

    Trajectory units: a unit's value is the mean of its valid calls' scores, over the calls of one trajectory
    (``prompt``) or of one agent in one trajectory (``prompt_agent``).

    Args:
        scores: (B,) float64. valid: (B,) bool, rows that take part (the others neither count nor get a value).
        uid, agent_id: (B,) ids. traj_uid: (B,) ids, needed by trajectory units. turn: (B,) ints, needed by
            ``prompt_agent_turn``.
        units: one of :data:`UNITS`, or None for the grouping's own (:data:`DEFAULT_UNITS`).

    Raises:
        ValueError: unknown ``grouping`` or ``units`` (:func:`resolve_units`), or a column they need is None.
    """
    per_agent, unit = cell(grouping, units)
    which = repr(grouping) if units is None else f"{grouping!r} with units {unit!r}"
    needs = ("traj_uid", traj_uid) if unit == "trajectory" else ("turn", turn) if grouping == "prompt_agent_turn" else None
    if needs is not None and needs[1] is None:
        raise ValueError(f"grouping {which} needs {needs[0]!r} (a (B,) column), got None")
    key = group_key(grouping, uid=uid, agent_id=agent_id, turn=turn)
    if unit == "call":
        s = np.where(valid, scores, 0.0)
        return Units(np.arange(len(s)), group_index(*key), s, np.asarray(valid, dtype=bool), key)
    # trajectory units: (uid, traj_uid), or (uid, traj_uid, agent_id) per agent
    row_unit = group_index(uid, traj_uid, agent_id) if per_agent else group_index(uid, traj_uid)  # (B,)
    count, value, _ = group_stats(scores, row_unit, unbiased=True, weight=valid)  # the mean of the valid calls' scores
    group = np.zeros(len(count), dtype=np.int64)
    group[row_unit] = group_index(*key)
    return Units(row_unit, group, value, count > 0, key)
