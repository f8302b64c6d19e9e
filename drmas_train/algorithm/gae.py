"""Generalised advantage estimation (GAE) over the tokens of each agent call, for PPO with a critic.

Shape legend: **B** samples (agent calls), **T** response tokens (right-padded; ``mask`` marks real tokens).

GAE (Schulman et al. 2016, arXiv 1506.02438, Eq. (16)) per token ``t`` of a response::

    delta_t = r_t + gamma V_{t+1} - V_t            (V_T = 0: the call's end is terminal)
    A_t     = delta_t + gamma lam A_{t+1}
    R_t     = A_t + V_t                            (the critic's target)

then the advantages are whitened over every real token of the batch (the estimator ``gae``,
:func:`drmas_train.algorithm.advantages.gae_estimator`). This is the reference's
``compute_gae_advantage_return`` (``langfengQ/DrMAS verl/trainer/ppo/core_algos.py:451-493``) with its
``masked_whiten`` (``verl/utils/torch_functional.py:170-187``).

**Multi-agent episodes, per call** (the reference's PPO example, ``examples/ppo_trainer/run_math.sh`` with its
episode reward manager): every agent call is a row of its own whose response is one GAE episode. Its token rewards
are 0 except at the last response token, which carries the call's score (the episode reward ``R`` minus the call's
format penalty, ``agent_system/reward_manager/episode.py:82`` and ``verl/trainer/ppo/ray_trainer.py:220``), minus
any per-token KL penalty (``ray_trainer.py:155-199``); ``V_t`` is the critic's value of the call's prompt plus the
response's first ``t`` tokens. Nothing is bootstrapped from one call to the next: a call's prompt already holds what
its teammates said, and its value is learnt from the returns of calls made in that context.

One difference from the reference, by choice: the reference masks the critic's values with the attention mask
shifted by one token (``verl/workers/critic/dp_critic.py:175``: ``attention_mask[:, -T - 1 : -1]``), so a response
shorter than ``T`` keeps the value of the state *after* its last token and, with ``lam < 1``, its GAE bootstraps
from it (the critic then learns that state's value towards 0). Here the values are masked with the response mask, so
the end of a call is terminal (``V_T = 0``) as in the textbook definition. The two agree on a response that fills
``T``, and on every response at ``lam = 1`` (the reference's default: the extra value cancels out);
tests/fidelity/test_critic_and_loss_recipes_fidelity.py shows both.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["GAMMA", "LAM", "gae", "call_token_rewards", "pad_rows"]

#: the defaults of the discount and of GAE's lambda (the reference's ``algorithm.gamma`` and ``algorithm.lam``, 1.0:
#: undiscounted Monte-Carlo returns minus the critic's values). Written once: :func:`drmas_train.algorithm.advantages.gae_estimator`
#: and the ``algorithm`` config section name these constants.
GAMMA = 1.0
LAM = 1.0


def pad_rows(rows: Sequence[Sequence[float]], length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad B variable-length rows into a (B, T) float64 array and its (B, T) 0/1 mask.

    Args:
        rows: B rows (row b has ``T_b`` entries). length: T (default: the longest row); longer rows are cut.
    """
    t = max((len(r) for r in rows), default=0) if length is None else length
    out, mask = np.zeros((len(rows), t)), np.zeros((len(rows), t))
    for b, row in enumerate(rows):
        n = min(len(row), t)
        out[b, :n] = np.asarray(row[:n], dtype=np.float64)
        mask[b, :n] = 1.0
    return out, mask


def call_token_rewards(
    scores: Sequence[float] | np.ndarray,
    lengths: Sequence[int],
    token_penalty: Sequence[Sequence[float]] | None = None,
) -> np.ndarray:
    """(B, T) token rewards of B calls: each call's score at its last response token, minus ``token_penalty``.

    Args:
        scores: (B,) per-call scores (``Sample.reward``). lengths: (B,) response tokens of each call (T = the
            longest); a call without response tokens has nowhere to put its score and gets none.
        token_penalty: B rows of per-token penalties (``T_b`` each), e.g. ``beta * KL_t`` for the KL in the reward
            (:func:`drmas_train.algorithm.reward_shaping.kl_reward_penalty`); None = none.
    """
    n = np.asarray(lengths, dtype=np.int64)
    rewards = np.zeros((len(n), int(n.max(initial=0))))
    has = n > 0
    rewards[np.flatnonzero(has), n[has] - 1] = np.asarray(scores, dtype=np.float64)[has]
    if token_penalty is not None:
        penalty, _ = pad_rows(token_penalty, rewards.shape[1])
        rewards -= penalty
    return rewards


def gae(
    token_rewards: np.ndarray, values: np.ndarray, mask: np.ndarray, *, gamma: float, lam: float
) -> tuple[np.ndarray, np.ndarray]:
    """GAE advantages (not yet whitened) and returns of B responses (see the module doc).

    Args:
        token_rewards: (B, T) float rewards. values: (B, T) the critic's ``V_t``. mask: (B, T) 1 on real tokens;
            rewards and values outside it are ignored (taken as 0).
        gamma: discount per token (``algorithm.gamma``). lam: the GAE lambda (``algorithm.lam``).

    Returns:
        ``(advantages, returns)``, each (B, T) float64 and 0 outside ``mask``; the estimator ``gae``
        (:func:`drmas_train.algorithm.advantages.gae_estimator`) whitens the advantages over the batch, the critic
        regresses on the returns ``A_t + V_t``.

    Raises:
        ValueError: the three arrays differ in shape, or gamma / lam outside [0, 1].
    """
    if not token_rewards.shape == values.shape == mask.shape:
        raise ValueError(f"token_rewards {token_rewards.shape}, values {values.shape} and mask {mask.shape} must have "
                         "the same (B, T) shape")  # fmt: skip
    if not (0 <= gamma <= 1 and 0 <= lam <= 1):
        raise ValueError(f"gamma and lam must be in [0, 1], got {gamma}, {lam}")
    m = np.asarray(mask, dtype=np.float64)
    r = np.asarray(token_rewards, dtype=np.float64) * m
    v = np.asarray(values, dtype=np.float64) * m
    adv = np.zeros_like(v)
    last = np.zeros(v.shape[0])
    for t in reversed(range(v.shape[1])):  # vectorised over the batch, as the reference
        next_v = v[:, t + 1] if t + 1 < v.shape[1] else 0.0
        delta = r[:, t] + gamma * next_v - v[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv * m, (adv + v) * m
