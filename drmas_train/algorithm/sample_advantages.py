"""Advantages of a batch of :class:`~drmas_train.collect.samples.Sample` with the configured estimator.

Builds each estimator's columns from the samples (:mod:`drmas_train.algorithm.advantages` stays a set of pure
functions over arrays):

==================== =================================================================================
column               from
==================== =================================================================================
``scores``           ``Sample.reward`` (the episode reward minus the call's format penalty)
``uid``, ``agent_id``, ``traj_uid`` the sample's ids
``turn``             ``Sample.agent_turn`` (the agent's own call index: AT-GRPO's turn groups)
``token_count``      ``sum(Sample.response_mask)`` (REINFORCE++ whitening weights)
``anchor``           ``Sample.anchor_key`` (GiGPO anchor states)
``step_rewards``     GiGPO with ``gamma < 1``: the discounted return of the call's round, minus its penalty
``baseline``         ReMax: :func:`~drmas_train.algorithm.advantages.greedy_baseline` of the greedy rollout
``values``           GAE: the critic's ``V_t`` of each response token (the updater's ``critic_values``)
``token_penalty``    GAE with the KL in the reward: ``beta KL_t`` of each response token
==================== =================================================================================

Only the columns an estimator's signature names are built and passed. The KL in the reward
(:mod:`drmas_train.algorithm.reward_shaping`) enters the other estimators through ``scores``: each call's score
loses the sum of its tokens' penalties, as the reference's ``token_level_rewards.sum(-1)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from drmas_train.algorithm.advantages import (
    DEFAULT_GROUPING,
    env_rounds,
    get_estimator,
    greedy_baseline,
    step_discounted_returns,
)
from drmas_train.algorithm.gae import call_token_rewards, gae, pad_rows

__all__ = ["sample_advantages", "gigpo_step_rewards", "gae_returns"]


ENV_STEPS = ("round", "episode")


def gigpo_step_rewards(samples: Sequence[Any], gamma: float, env_step: str = "round") -> np.ndarray:
    """(B,) GiGPO step rewards: each call's discounted return from its env step, minus its format penalty.

    The env pays the episode reward ``R`` (``Sample.score``) at the end and nothing before, so the return of step
    k of K is ``gamma^(K-1-k) R`` (:func:`~drmas_train.algorithm.advantages.step_discounted_returns`); the penalty is
    subtracted afterwards, as the reference does (``verl/trainer/ppo/ray_trainer.py:222-223``). Computed as
    ``reward + (return - R)``, so ``gamma = 1`` gives ``Sample.reward`` exactly.

    Args:
        env_step: what one env step is, as the env's ``metadata["reference_env_step"]`` says: ``"round"``
            (:func:`~drmas_train.algorithm.advantages.env_rounds`: Verifier + Search/Answer in the search env) or
            ``"episode"`` (the reference's math env is done after one step, every call's env_step is 1, so every
            call's return is ``R`` whatever ``gamma``: the result is ``Sample.reward``).

    Raises:
        ValueError: an ``env_step`` other than ``"round"`` or ``"episode"``.
    """
    if env_step not in ENV_STEPS:
        raise ValueError(f"env_step={env_step!r}; accepted: {', '.join(ENV_STEPS)}")
    if env_step == "episode":
        return np.array([s.reward for s in samples], dtype=np.float64)
    traj = [s.traj_uid for s in samples]
    rounds = env_rounds(traj, [s.turn for s in samples], [s.agent_id for s in samples])
    last_round: dict[str, int] = {}
    for t, r in zip(traj, rounds, strict=True):
        last_round[t] = max(last_round.get(t, 0), int(r))
    final = np.array([rounds[i] == last_round[t] for i, t in enumerate(traj)], dtype=bool)
    episode = np.array([s.score for s in samples], dtype=np.float64)
    returns = step_discounted_returns(
        np.where(final, episode, 0.0), traj_uid=traj, env_step=rounds, gamma=gamma
    )
    return np.array([s.reward for s in samples], dtype=np.float64) + (returns - episode)


def sample_advantages(
    samples: Sequence[Any],
    algorithm: Any,
    *,
    greedy: Sequence[Any] | None = None,
    values: Sequence[Sequence[float]] | None = None,
    token_penalty: Sequence[Sequence[float]] | None = None,
    env_step: str = "round",
) -> np.ndarray:
    """Advantages of ``samples`` under ``algorithm`` (the ``algorithm`` section of the training config:
    ``estimator``, ``grouping``, ``units``, ``scale``, ``norm_by_std``, ``eps``, ``unbiased_std``, ``singleton``, ``gamma``, ``lam``,
    ``gigpo_step_weight``): (B,) float64, one per call, or (B, T) per token for ``gae``.

    Args:
        greedy: the greedy rollout's samples, ``uid`` matching
            (:func:`drmas_train.collect.greedy_rollout.greedy_rollout`); required by estimators with a ``baseline``
            (ReMax), ignored otherwise.
        values: B rows of the critic's per-token values; required by estimators that read ``values`` (GAE).
        token_penalty: B rows of per-token reward penalties (the KL in the reward,
            :func:`drmas_train.algorithm.reward_shaping.kl_reward_penalty`), or None.
        env_step: GiGPO's env step (:func:`gigpo_step_rewards`): the env's ``metadata["reference_env_step"]``.

    Raises:
        ValueError: unknown estimator; ReMax without ``greedy``; GAE without ``values``; GiGPO on samples without
            ``anchor_key``; the estimator's own errors.
    """
    a = algorithm
    fn = get_estimator(a.estimator)
    params = inspect.signature(fn).parameters
    scores = np.array([s.reward for s in samples], dtype=np.float64)
    if (
        token_penalty is not None and "token_penalty" not in params
    ):  # a call's reward is the sum of its tokens'
        scores = scores - np.array([float(np.sum(p)) for p in token_penalty])
    kw: dict[str, Any] = dict(
        uid=[s.uid for s in samples], agent_id=[s.agent_id for s in samples], traj_uid=[s.traj_uid for s in samples],
        turn=[s.agent_turn for s in samples], grouping=a.grouping, norm_by_std=a.norm_by_std, eps=a.eps,
        unbiased=a.unbiased_std, singleton=a.singleton,
    )  # fmt: skip
    if "scale" in params:
        kw["scale"] = a.scale
    if "units" in params:
        kw["units"] = a.units
    if "token_count" in params:
        kw["token_count"] = [sum(s.response_mask) for s in samples]
    if "gamma" in params:
        kw["gamma"] = a.gamma
    if "lam" in params:
        kw["lam"] = a.lam
    if "values" in params:
        if values is None:
            raise ValueError(f"{a.estimator} needs the critic's per-token values (values=...)")
        kw["values"] = list(values)
    if "token_penalty" in params:
        kw["token_penalty"] = token_penalty
    if "anchor" in params:
        missing = [i for i, s in enumerate(samples) if not s.anchor_key]
        if missing:
            raise ValueError(f"{a.estimator} needs each call's anchor state, but {len(missing)} sample(s) have no "
                             f"anchor_key (first: row {missing[0]}); samples from the rollout engine carry it")  # fmt: skip
        kw["anchor"] = [s.anchor_key for s in samples]
    if "step_rewards" in params and a.gamma != 1:
        kw["step_rewards"] = gigpo_step_rewards(samples, a.gamma, env_step)
    if "step_weight" in params:
        kw["step_weight"] = a.gigpo_step_weight
    if "baseline" in params:
        if greedy is None:
            raise ValueError(
                f"{a.estimator} needs the greedy rollout's samples (greedy=...) for its baseline"
            )
        kw["baseline"] = greedy_baseline(
            a.grouping or DEFAULT_GROUPING[a.estimator], uid=kw["uid"], agent_id=kw["agent_id"], turn=kw["turn"],
            greedy_scores=[g.reward for g in greedy], greedy_uid=[g.uid for g in greedy],
            greedy_agent_id=[g.agent_id for g in greedy], greedy_turn=[g.agent_turn for g in greedy],
        )  # fmt: skip
    return fn(scores, **kw)


def gae_returns(
    samples: Sequence[Any],
    values: Sequence[Sequence[float]],
    algorithm: Any,
    *,
    token_penalty: Sequence[Sequence[float]] | None = None,
) -> list[np.ndarray]:
    """The critic's targets: B rows of GAE returns ``A_t + V_t`` (one per response token), from the same token
    rewards as the ``gae`` estimator's advantages (:func:`drmas_train.algorithm.gae.gae`; ``algorithm.gamma``,
    ``algorithm.lam``).

    Args:
        samples: (B,). values: B rows of the critic's values (as given to :func:`sample_advantages`).
        token_penalty: as :func:`sample_advantages`.

    Raises:
        ValueError: a ``values`` row of another length than its call's response.
    """
    lengths = [len(s.response_ids) for s in samples]
    if [len(v) for v in values] != lengths:
        raise ValueError("values must hold one value per response token of each sample")
    v, mask = pad_rows(values)
    rewards = call_token_rewards([s.reward for s in samples], lengths, token_penalty)
    _, returns = gae(rewards, v, mask, gamma=algorithm.gamma, lam=algorithm.lam)
    return [returns[b, :n] for b, n in enumerate(lengths)]
