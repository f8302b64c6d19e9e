"""Reward terms around the loss: DAPO's overlong-response penalty and the KL penalty in the reward (fixed or
adaptive coefficient).

Shape legend: **B** samples (agent calls), **T_b** response tokens of call b.

Both change what a call is rewarded before any advantage is computed:

* **Overlong penalty** (DAPO's soft overlong punishment, arXiv 2503.14476 Eq. (13); the reference's DAPO reward
  manager, ``langfengQ/DrMAS verl/workers/reward_manager/dapo.py:105-111``): a response of ``L`` tokens whose length
  limit is ``L_max`` (``rollout.max_new_tokens``) gets ``min(-(L - (L_max - buffer)) / buffer * factor, 0)``: nothing
  up to ``L_max - buffer`` tokens, then a penalty growing linearly to ``-factor`` at ``L_max``. Applied per agent
  call (each call is a response with its own limit) to the call's score, ``Sample.reward``.
* **KL in the reward** (the reference's ``apply_kl_penalty``, ``verl/trainer/ppo/ray_trainer.py:155-199``): every
  response token is rewarded ``-beta * KL_t``, ``KL_t`` an estimate (k1, k2 or k3,
  :func:`drmas_train.algorithm.losses.kl_penalty`) of KL(pi_old || pi_ref) at that token. The reference subtracts
  it from its token-level rewards; estimators that score a whole call read the call's reward as the sum over its
  tokens (``token_level_rewards.sum(-1)``), so for them the call's score loses ``beta * sum_t KL_t``; GAE keeps it
  per token (:func:`drmas_train.algorithm.gae.call_token_rewards`). ``beta`` comes from a KL controller:
  :class:`FixedKLController` or :class:`AdaptiveKLController` (Ziegler et al. 2019, arXiv 1909.08593; the reference's,
  ``verl/trainer/ppo/core_algos.py:35-70``), updated once per batch with the batch's mean per-call KL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.losses import kl_penalty
from drmas_train.collect.samples import Sample

__all__ = [
    "KL_CONTROLS",
    "overlong_penalty",
    "apply_overlong_penalty",
    "kl_reward_penalty",
    "FixedKLController",
    "AdaptiveKLController",
    "make_kl_controller",
]

#: accepted ``algorithm.reward_kl_control`` values.
KL_CONTROLS = ("fixed", "adaptive")


def overlong_penalty(
    lengths: Sequence[int] | np.ndarray, *, max_length: int, buffer: int, factor: float
) -> np.ndarray:
    """(B,) float64 DAPO overlong penalties (<= 0) of responses of ``lengths`` tokens (see the module doc).

    Args:
        lengths: (B,) response tokens. max_length: the response limit (``rollout.max_new_tokens``).
        buffer: the soft zone's width in tokens (``algorithm.overlong_buffer``, > 0). factor: the penalty at the
            limit (``algorithm.overlong_penalty_factor``).

    Raises:
        ValueError: ``buffer`` not in [1, max_length].
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"overlong buffer must be in [1, max_length={max_length}] tokens, got {buffer}")
    exceed = np.asarray(lengths, dtype=np.float64) - (max_length - buffer)
    return np.minimum(-exceed / buffer * factor, 0.0)


def apply_overlong_penalty(
    samples: Sequence[Sample], *, max_length: int, buffer: int, factor: float
) -> tuple[list[Sample], dict[str, float]]:
    """The samples with each call's overlong penalty added to its ``reward`` (copies where it is non-zero, the
    penalty recorded in ``extra["overlong_penalty"]``), and the metrics ``reward/overlong_share`` (share of calls
    penalised) and ``reward/overlong_penalty_mean`` (mean penalty over all calls)."""
    pen = overlong_penalty(
        [len(s.response_ids) for s in samples], max_length=max_length, buffer=buffer, factor=factor
    )
    out = [
        s
        if p == 0
        else dataclasses.replace(
            s, reward=s.reward + float(p), extra={**s.extra, "overlong_penalty": float(p)}
        )
        for s, p in zip(samples, pen, strict=True)
    ]
    share = float(np.mean(pen < 0)) if len(pen) else 0.0
    return out, {
        "reward/overlong_share": share,
        "reward/overlong_penalty_mean": float(pen.mean()) if len(pen) else 0.0,
    }


def kl_reward_penalty(
    logprobs: Sequence[Sequence[float]],
    ref_logprobs: Sequence[Sequence[float]],
    masks: Sequence[Sequence[int]],
    *,
    estimator: str,
    coef: float,
) -> tuple[list[np.ndarray], float]:
    """Per-token KL penalties ``coef * KL_t`` of B calls, and the batch's mean KL (the controller's input).

    Args:
        logprobs: B rows of pi_old's log-probs of the response tokens (``T_b`` each). ref_logprobs: the frozen
            reference's, same shape. masks: B response masks (tokens with 0 get no penalty).
        estimator: ``k1`` | ``k2`` | ``k3`` (:func:`drmas_train.algorithm.losses.kl_penalty`). coef: beta.

    Returns:
        ``(penalties, mean_kl)``: B float64 arrays of ``coef * KL_t * mask_t``; ``mean_kl`` = the mean over calls
        of each call's token-mean KL (0 for a call without a counted token), the reference's ``current_kl``
        (``verl/trainer/ppo/ray_trainer.py:191-192``).

    Raises:
        ValueError: rows of different counts or lengths; an unknown estimator.
    """
    if not len(logprobs) == len(ref_logprobs) == len(masks):
        raise ValueError(
            f"got {len(logprobs)} log-prob rows, {len(ref_logprobs)} reference rows and {len(masks)} masks"
        )
    penalties, per_call = [], []
    for b, (lp, ref, m) in enumerate(zip(logprobs, ref_logprobs, masks, strict=True)):
        if not len(lp) == len(ref) == len(m):
            raise ValueError(
                f"row {b}: {len(lp)} log-probs, {len(ref)} reference log-probs, {len(m)} mask entries"
            )
        mask = np.asarray(m, dtype=np.float64)
        kl = kl_penalty(torch.as_tensor(np.asarray(lp, dtype=np.float64)), torch.as_tensor(np.asarray(ref, dtype=np.float64)),
                        estimator).numpy() * mask  # fmt: skip
        penalties.append(coef * kl)
        per_call.append(kl.sum() / mask.sum() if mask.sum() > 0 else 0.0)
    return penalties, float(np.mean(per_call)) if per_call else 0.0


class FixedKLController:
    """A constant KL coefficient ``value`` (the reference's ``FixedKLController``)."""

    def __init__(self, coef: float) -> None:
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing changes."""

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """The adaptive KL coefficient of Ziegler et al. 2019 (arXiv 1909.08593, Sec. 2.2), as the reference's::

        e     = clip(KL / target - 1, -0.2, 0.2)
        beta <- beta * (1 + e * n_steps / horizon)

    Args:
        coef: initial beta. target: the KL it steers to (> 0). horizon: how many samples a full 20 % step takes (> 0).
    """

    def __init__(self, coef: float, *, target: float, horizon: int) -> None:
        super().__init__(coef)
        if not (target > 0 and horizon > 0):
            raise ValueError(f"adaptive KL control needs target > 0 and horizon > 0, got {target}, {horizon}")
        self.target, self.horizon = float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """One update with the batch's mean KL ``current_kl`` over ``n_steps`` calls (rows)."""
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(control: str, *, coef: float, target: float, horizon: int) -> FixedKLController:
    """The controller of ``algorithm.reward_kl_control``.

    Raises:
        ValueError: ``control`` not in :data:`KL_CONTROLS`; adaptive with ``target`` or ``horizon`` <= 0.
    """
    if control == "fixed":
        return FixedKLController(coef)
    if control == "adaptive":
        return AdaptiveKLController(coef, target=target, horizon=horizon)
    raise ValueError(f"unknown KL control {control!r}; accepted: {list(KL_CONTROLS)}")
