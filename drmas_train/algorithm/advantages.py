"""Group-relative advantage estimators: ``grpo``, ``drmas``, ``grpo_step``, ``per_turn``.

Every estimator is a pure, vectorised function of per-sample (one sample = one agent call) arrays and returns
one advantage per sample; the trainer broadcasts it over the response tokens (B,) -> (B, T)::

    advantages = get_estimator("drmas")(scores, uid=uid, agent_id=agent_id, traj_uid=traj_uid, turn=turn)

Shape legend: **B** samples (agent calls) in the batch, **G** rollouts per task. All inputs are (B,) arrays
(or sequences); ``scores`` are floats, the id columns hold hashable values (str or int).

They differ only in the *group key* over which the baseline mean/std are taken (all from
Dr. MAS, arXiv 2602.08847, Sec. 4; the formula is the paper's Eq. (3) with the group key changed):

======== ====================================== =====================================================
name     group key                              unit that is normalised
======== ====================================== =====================================================
grpo     ``uid``                                trajectory score = mean of its calls' scores
drmas    (``uid``, ``agent_id``)                each call keeps its own score (paper Eq. (5))
grpo_step ``uid``                               each call (global step-level ablation)
per_turn (``uid``, ``agent_id``, ``turn``)        each call (AT-GRPO, arXiv 2510.11062)
======== ====================================== =====================================================

``A = (s - mean_g) / (std_g + eps)``, or ``A = s - mean_g`` with ``norm_by_std=False`` (Dr. GRPO,
arXiv 2503.20783). ``std_g`` is the unbiased (n-1) sample std by default, as ``torch.std`` in the
verl/DrMAS reference.

Conventions (decided here, pinned by tests/train/test_advantages.py):

* **Singleton groups** (one valid member) get ``A = 0`` by default (``singleton="zero"``). The reference gives a
  group of one mean 0 and std 1 (``langfengQ/DrMAS verl/trainer/ppo/core_algos.py:553-555``), so its advantage
  is the raw score ``s / (1 + eps)`` (``s`` without std normalisation, ``core_algos.py:562-566``);
  ``singleton="raw"`` reproduces that. drmas's default differs on purpose: the raw score is not a
  group-*relative* quantity (scores vs. standardised units, non-zero mean), so a lone sample would push its
  policy in the direction of the raw reward sign; with no contrast there is no baseline, so no learning signal,
  the same treatment as a zero-variance group.

  Worked example, Dr. MAS search (``drmas``, key (``uid``, ``agent_id``)): a prompt group of G = 5 rollouts in
  which the Verifier said "no" in only one rollout, so the group ("q17", "search") holds one Search call. That
  episode was answered correctly (R = 1) and the call was valid, so its score is 1.0. ``singleton="zero"``: A = 0,
  the call is not reinforced (nothing to compare it with). ``singleton="raw"`` (reference): A = 1 / (1 + 1e-6)
  = 0.999999, a full unit-scale push, as large as the best call of a well-contrasted group; had the episode
  failed (R = 0) A would be 0, and with an invalid call (score -0.01) A = -0.00999999. The 4 other rollouts' calls
  of the Verifier and Answer agents are normalised in their own groups either way.
* **Zero / near-zero variance**: deviations are computed in float64 with a two-pass (subtract the mean first)
  scheme, and a group whose std is below ``ZERO_STD_RTOL * max(1, |mean|)`` is treated as exactly constant:
  all its advantages are 0 (so eight 0.9s give exactly 0, not float residue divided by eps).
* **Non-representable scores**: a finite score with ``|s| > MAX_ABS_SCORE`` (1e150) raises ``ValueError``
  (:func:`check_scores`): the squared deviations of the std would overflow float64 (|s| >~ 1.3e154) and the whole
  group would silently get advantage 0. Scale such rewards down in the env.
* **Non-finite scores** (nan/inf) are excluded from every group statistic and get ``A = 0``; a
  :class:`RuntimeWarning` says how many.
* **Padding / duplication**: rows with ``mask=False`` are ignored (A = 0) and do not affect other rows, so the
  trainer computes advantages once on the real samples before any micro-batch padding.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "ZERO_STD_RTOL",
    "SINGLETON_MODES",
    "MAX_ABS_SCORE",
    "check_scores",
    "AdvantageEstimator",
    "ESTIMATORS",
    "register_estimator",
    "get_estimator",
    "group_index",
    "group_stats",
    "normalize_in_groups",
    "grpo",
    "drmas",
    "grpo_step",
    "per_turn",
]

#: accepted values of the estimators' ``singleton`` argument (see the module doc); the first is the default.
SINGLETON_MODES = ("zero", "raw")

#: a group whose std is below ``ZERO_STD_RTOL * max(1, |mean|)`` counts as constant (advantages exactly 0).
ZERO_STD_RTOL = 1e-7

#: largest accepted |score|: B squared deviations of up to 2 * 1e150 each stay below float64's max (1.8e308) for
#: any batch up to 1e6 samples, so the group std never overflows.
MAX_ABS_SCORE = 1e150


def check_scores(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """``scores`` as a (B,) float64 array, after checking that the group statistics can represent them.

    Non-finite values (nan/inf) pass (the estimators exclude them with a warning).

    Raises:
        ValueError: a finite score with ``|s| > MAX_ABS_SCORE``; the message gives the first offending index and
            value and says to scale the rewards.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    big = np.flatnonzero(np.isfinite(s) & (np.abs(s) > MAX_ABS_SCORE))
    if big.size:
        i = int(big[0])
        raise ValueError(
            f"{big.size} score(s) too large for advantage statistics: scores[{i}] = {float(s[i])!r}, but |score| must be "
            f"<= {MAX_ABS_SCORE:g} (squaring larger deviations overflows float64 and would zero the whole group); "
            "scale the rewards down"
        )
    return s


class AdvantageEstimator(Protocol):
    """``fn(scores, *, uid, agent_id, traj_uid, turn, mask=None, norm_by_std=True, eps=1e-6, unbiased=True,
    singleton="zero")`` -> advantages (B,) float64."""

    def __call__(
        self,
        scores: Sequence[float] | np.ndarray,
        *,
        uid: Sequence[Any] | np.ndarray,
        agent_id: Sequence[Any] | np.ndarray,
        traj_uid: Sequence[Any] | np.ndarray | None = None,
        turn: Sequence[int] | np.ndarray | None = None,
        mask: Sequence[bool] | np.ndarray | None = None,
        norm_by_std: bool = True,
        eps: float = 1e-6,
        unbiased: bool = True,
        singleton: str = "zero",
    ) -> np.ndarray: ...


#: name -> estimator, filled by :func:`register_estimator`.
ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator adding an estimator to :data:`ESTIMATORS` under ``name``.

    Raises:
        ValueError: if ``name`` is already registered.
    """

    def deco(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ESTIMATORS[name] = fn
        return fn

    return deco


def get_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``.

    Raises:
        ValueError: unknown name; the message lists the accepted names and suggests the closest one.
    """
    if name in ESTIMATORS:
        return ESTIMATORS[name]
    close = difflib.get_close_matches(str(name), ESTIMATORS, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown advantage estimator {name!r}; accepted: {sorted(ESTIMATORS)}.{hint}")


# ---------------------------------------------------------------- the one shared group-statistics helper


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


def normalize_in_groups(
    values: np.ndarray,
    groups: np.ndarray,
    *,
    valid: np.ndarray,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    unbiased: bool = True,
    singleton: str = "zero",
) -> np.ndarray:
    """``(v - mean_g) / (std_g + eps)`` per row (or ``v - mean_g`` without std), with the module conventions.

    Args:
        values: (B,) float scores. groups: (B,) dense int group ids. valid: (B,) bool, rows that take part.
        singleton: advantage of a group with one valid member: ``"zero"`` (drmas) or ``"raw"`` (the reference:
            mean 0, std 1, i.e. ``v / (1 + eps)``, or ``v`` without std normalisation).

    Returns:
        (B,) float64; 0 for invalid rows and (near-)constant groups; singleton groups as ``singleton`` says.

    Raises:
        ValueError: unknown ``singleton``.
    """
    if singleton not in SINGLETON_MODES:
        raise ValueError(f"singleton must be one of {SINGLETON_MODES}, got {singleton!r}")
    count, mean, std = group_stats(values, groups, unbiased=unbiased, weight=valid)
    constant = (count < 2) | (std <= ZERO_STD_RTOL * np.maximum(1.0, np.abs(mean)))
    v = np.where(valid, np.asarray(values, dtype=np.float64), 0.0)
    dev = v - mean[groups]  # Dr. MAS Eq. (3) numerator
    adv = dev / (std[groups] + eps) if norm_by_std else dev
    adv = np.where(valid & ~constant[groups], adv, 0.0)
    if singleton == "raw":  # langfengQ/DrMAS verl/trainer/ppo/core_algos.py:553-555 (mean 0, std 1), :562-566
        lone = valid & (count[groups] == 1)
        adv = np.where(lone, v / (1.0 + eps) if norm_by_std else v, adv)
    return adv


def _prepare(scores, mask, *cols) -> tuple[np.ndarray, np.ndarray]:
    s = check_scores(scores)
    for name, col in cols:
        if col is None:
            raise ValueError(f"this estimator needs {name!r} (a (B,) column), got None")
        if len(col) != len(s):
            raise ValueError(f"{name} has length {len(col)} but scores has length {len(s)}")
    valid = np.ones(len(s), dtype=bool) if mask is None else np.asarray(mask, dtype=bool).reshape(-1)
    if len(valid) != len(s):
        raise ValueError(f"mask has length {len(valid)} but scores has length {len(s)}")
    finite = np.isfinite(s)
    bad = int((valid & ~finite).sum())
    if bad:
        warnings.warn(
            f"{bad} non-finite score(s) excluded from advantage statistics (their advantage is 0)",
            RuntimeWarning,
            stacklevel=3,
        )
    return s, valid & finite


# ---------------------------------------------------------------- estimators


@register_estimator("grpo")
def grpo(
    scores, *, uid, agent_id, traj_uid=None, turn=None, mask=None, norm_by_std=True, eps=1e-6, unbiased=True,
    singleton="zero",
):
    """Vanilla GRPO over trajectories (the Dr. MAS paper's baseline, arXiv 2602.08847 Eq. (3)).

    Per prompt group ``uid``, each trajectory's score is the mean of its valid calls' scores; trajectories are
    normalised over the G trajectories of the group; every call gets its trajectory's advantage.

    Args:
        scores: (B,) per-call scores. uid, agent_id, traj_uid: (B,) ids (``traj_uid`` required).
        turn: unused. mask: (B,) bool, rows to include (False = padding, A = 0).
        singleton: ``"zero"`` (default) or ``"raw"`` (the reference), see the module doc.

    Returns:
        (B,) float64 advantages.

    Raises:
        ValueError: missing ``traj_uid``, length mismatch, or unknown ``singleton``.
    """
    s, valid = _prepare(scores, mask, ("uid", uid), ("agent_id", agent_id), ("traj_uid", traj_uid))
    traj = group_index(uid, traj_uid)  # (B,) trajectory ids
    t_count, t_score, _ = group_stats(s, traj, weight=valid)  # (n_traj,) mean call score per trajectory
    t_valid = t_count > 0
    t_uid = np.zeros(len(t_count), dtype=np.int64)
    t_uid[traj] = group_index(uid)  # each trajectory's prompt group
    t_adv = normalize_in_groups(t_score, t_uid, valid=t_valid, norm_by_std=norm_by_std, eps=eps, unbiased=unbiased,
                                 singleton=singleton)
    return np.where(valid, t_adv[traj], 0.0)


@register_estimator("drmas")
def drmas(
    scores, *, uid, agent_id, traj_uid=None, turn=None, mask=None, norm_by_std=True, eps=1e-6, unbiased=True,
    singleton="zero",
):
    """Dr. MAS agent-wise normalisation (arXiv 2602.08847, Eq. (5)): group key (``uid``, ``agent_id``).

    All calls of agent k in prompt group ``uid`` (all turns, all G rollouts) are pooled; each keeps its own score:
    ``A = (s - mu_{uid,k}) / (sigma_{uid,k} + eps)``. With a single agent this equals :func:`grpo_step`.

    Args/Returns/Raises: as :func:`grpo` (``traj_uid`` and ``turn`` unused).
    """
    s, valid = _prepare(scores, mask, ("uid", uid), ("agent_id", agent_id))
    return normalize_in_groups(
        s, group_index(uid, agent_id), valid=valid, norm_by_std=norm_by_std, eps=eps, unbiased=unbiased,
        singleton=singleton,
    )


@register_estimator("grpo_step")
def grpo_step(
    scores, *, uid, agent_id, traj_uid=None, turn=None, mask=None, norm_by_std=True, eps=1e-6, unbiased=True,
    singleton="zero",
):
    """Global step-level GRPO: per ``uid``, all calls of all agents pooled, each keeping its own score.

    The ablation between :func:`grpo` (per trajectory) and :func:`drmas` (per agent): same unit as ``drmas``
    (one call) but the global group of ``grpo``. Args/Returns/Raises: as :func:`grpo`.
    """
    s, valid = _prepare(scores, mask, ("uid", uid), ("agent_id", agent_id))
    return normalize_in_groups(s, group_index(uid), valid=valid, norm_by_std=norm_by_std, eps=eps, unbiased=unbiased,
                               singleton=singleton)


@register_estimator("per_turn")
def per_turn(
    scores, *, uid, agent_id, traj_uid=None, turn=None, mask=None, norm_by_std=True, eps=1e-6, unbiased=True,
    singleton="zero",
):
    """Per (``uid``, ``agent_id``, ``turn``) groups, as AT-GRPO (arXiv 2510.11062).

    ``turn`` should be the agent's own call index (``Sample.agent_turn``), so the group of "the solver's 2nd
    answer" pools that call across the G rollouts. Args/Returns/Raises: as :func:`grpo` (``turn`` required).
    """
    s, valid = _prepare(scores, mask, ("uid", uid), ("agent_id", agent_id), ("turn", turn))
    return normalize_in_groups(
        s, group_index(uid, agent_id, turn), valid=valid, norm_by_std=norm_by_std, eps=eps, unbiased=unbiased,
        singleton=singleton,
    )
