"""Stable-Baselines3 recipe: PPO trains one agent of a drmas env through the Gymnasium single-agent view.

``gymnasium.make("drmas/<id>", agent_id=..., others=..., aec_wrappers=[...])`` (:mod:`drmas_envs.wrappers.
single_agent`) controls one agent and plays the others with fixed policies, so every SB3 step is one
decision of the trained agent (its reward: its own rewards until its next turn). The observation is the
token ``Dict`` mapped to float features by ``gymnasium.wrappers.TransformObservation`` with
:func:`~drmas_train.integrations.numeric_env.token_features` (``input_ids / (V - 1)``, attention mask,
``action_mask``), which SB3's ``MlpPolicy`` takes as is.

Example (``stable-baselines3==2.9.2``)::

    env = sb3_env("math-solver-verifier-v0", "verifier", tokenizer, pad_id=pad, size=64)  # Discrete(2) verifier
    model = stable_baselines3.PPO("MlpPolicy", env, n_steps=64, batch_size=32, policy_kwargs={"net_arch": [64]})
    model.learn(total_timesteps=10_000)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
from pettingzoo import AECEnv

import drmas_envs.wrappers  # noqa: F401  (registers the drmas/<id> Gymnasium ids)
from drmas_envs.wrappers import DiscreteChoices, TokenSpaces
from drmas_envs.wrappers.single_agent import Policy, gymnasium_id
from drmas_train.integrations.numeric_env import (
    DEFAULT_CHOICES,
    boxed_answer_vocab,
    token_feature_space,
    token_features,
)

__all__ = ["sb3_env"]


def sb3_env(
    env_id: str,
    agent_id: str,
    tokenizer: Any,
    *,
    pad_id: int,
    others: Mapping[str, Policy | str] | str = "random",
    max_obs_tokens: int = 64,
    max_act_tokens: int = 8,
    action_vocab: Sequence[int] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
    text_wrappers: Sequence[Callable[[AECEnv], AECEnv]] = (),
    **env_kwargs: Any,
) -> gymnasium.Env:
    """A ``gymnasium.Env`` for agent ``agent_id`` of ``env_id`` with float ``Box`` observations.

    Args:
        env_id: drmas registry id; agent_id: the trained agent.
        tokenizer, pad_id: as for :class:`~drmas_envs.wrappers.TokenSpaces`.
        others: the other agents' policies (in the wrapped spaces) or ``"random"``.
        max_obs_tokens, max_act_tokens, action_vocab, choices: see
            :func:`~drmas_train.integrations.numeric_env.numeric_aec_env` (same defaults).
        text_wrappers: AEC wrappers applied to the text env first (e.g. a transcript recorder).
        env_kwargs: passed to ``drmas_envs.make``.

    Returns:
        ``TransformObservation(gymnasium.make("drmas/<env_id>", ...))``: observation
        ``Box(0, 1, (2*O [+ n],), float32)``, action ``Discrete(n)`` for a choice agent or
        ``MultiDiscrete([len(action_vocab)] * K)`` for a writer.

    Raises:
        the registry's lookup errors, and ``ValueError`` from :class:`~drmas_envs.wrappers.SingleAgentEnv`
        for an unknown ``agent_id``.
    """
    choices = DEFAULT_CHOICES.get(env_id, {}) if choices is None else choices
    vocab = list(action_vocab) if action_vocab is not None else boxed_answer_vocab(tokenizer, pad_id)
    wrappers = list(text_wrappers)
    if choices:
        wrappers.append(lambda e: DiscreteChoices(e, dict(choices)))
    wrappers.append(
        lambda e: TokenSpaces(e, tokenizer, max_obs_tokens, max_act_tokens, pad_id=pad_id, action_vocab=vocab)
    )
    env = gymnasium.make(gymnasium_id(env_id), agent_id=agent_id, others=others, aec_wrappers=wrappers, **env_kwargs)
    space = env.observation_space
    return gymnasium.wrappers.TransformObservation(
        env, lambda obs: token_features(obs, space), observation_space=token_feature_space(space)
    )
