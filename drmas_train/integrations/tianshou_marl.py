"""Tianshou recipe: a drmas env as a Tianshou multi-agent env, every agent choosing among texts.

Tianshou's ``PettingZooEnv`` (``tianshou/env/pettingzoo_env.py``) steps the AEC env, so only the agent whose
turn it is acts and its ``MultiAgentPolicy`` dispatches each transition to that agent's policy alone (by
``obs.agent_id``): no non-acting agent's step exists. It needs identical spaces for all agents and the
``{"observation", "action_mask"}`` observation convention: :class:`~drmas_envs.wrappers.MaskedSpaces`
gives both, over :class:`~drmas_envs.wrappers.DiscreteChoices` (a Verifier's approve/reject, a writer's
candidate answers) and :class:`~drmas_envs.wrappers.TokenSpaces` (the prompt as token ids).

Example (``tianshou==2.0.1``)::

    env = tianshou_env("math-solver-verifier-v0", tokenizer, pad_id=pad,
                       choices={"solver": [rf"\\boxed{{{d}}}" for d in range(10)], "verifier": VERIFIER_CHOICES},
                       size=64)
    algorithm = random_marl_algorithm(env, learners={"verifier": DQN(...)})  # the solver plays at random
    collector = Collector(algorithm, DummyVectorEnv([lambda: env]), VectorReplayBuffer(1000, 1))
    collector.collect(n_step=100, reset_before_collect=True)

Tianshou numba-compiles its replay-buffer helpers at first use (about 25 s of CPU); for short runs and
tests, ``NUMBA_DISABLE_JIT=1`` (set before importing tianshou) skips that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drmas_envs.wrappers import MaskedSpaces

__all__ = ["random_marl_algorithm", "tianshou_env"]


def tianshou_env(
    env_id: str,
    tokenizer: Any,
    *,
    pad_id: int,
    choices: Mapping[str, Sequence[str]],
    max_obs_tokens: int = 64,
    **env_kwargs: Any,
) -> Any:
    """``tianshou.env.PettingZooEnv(MaskedSpaces(TokenSpaces(DiscreteChoices(make(env_id), choices))))``.

    Args:
        env_id: drmas registry id.
        tokenizer: anything :class:`~drmas_envs.wrappers.TokenSpaces` accepts; ``pad_id`` its pad id.
        choices: agent -> candidate texts, for *every* agent of the env (Tianshou needs one ``Discrete``
            space for all; :class:`~drmas_envs.wrappers.MaskedSpaces` pads and masks the shorter lists).
        max_obs_tokens: ``O``: observations are ``2 * O`` ints (token ids, attention mask).
        env_kwargs: passed to ``drmas_envs.make``.

    Returns:
        a ``tianshou.env.PettingZooEnv``; its observations are ``{"agent_id", "obs" (2*O,) int64,
        "mask" list[bool] (N,)}``, rewards a list with one entry per agent.

    Raises:
        ValueError: an agent of the env has no ``choices`` (from :class:`~drmas_envs.wrappers.MaskedSpaces`).
    """
    from tianshou.env import PettingZooEnv

    from drmas_train.integrations.numeric_env import numeric_aec_env

    aec = numeric_aec_env(
        env_id,
        tokenizer,
        pad_id=pad_id,
        max_obs_tokens=max_obs_tokens,
        max_act_tokens=1,
        action_vocab=[pad_id],
        choices=choices,
        numeric_infos=False,
        **env_kwargs,
    )
    return PettingZooEnv(MaskedSpaces(aec))


def random_marl_algorithm(env: Any, learners: Mapping[str, Any] | None = None) -> Any:
    """Tianshou ``MultiAgentOffPolicyAlgorithm``: ``learners[agent]`` for some agents, uniform random for the rest.

    Args:
        env: a :func:`tianshou_env` env (its ``agents`` order is the algorithm order Tianshou expects).
        learners: agent -> a Tianshou off-policy algorithm (e.g. ``DQN``) that trains that agent; agents
            not listed pick uniformly among their legal (unmasked) choices.

    Raises:
        ValueError: ``learners`` names an agent the env does not have.
    """
    from tianshou.algorithm.multiagent.marl import MultiAgentOffPolicyAlgorithm
    from tianshou.algorithm.random import MARLRandomDiscreteMaskedOffPolicyAlgorithm

    learners = dict(learners or {})
    unknown = sorted(set(learners) - set(env.agents))
    if unknown:
        raise ValueError(f"learners for {unknown}, which are not agents of the env ({list(env.agents)})")
    return MultiAgentOffPolicyAlgorithm(
        algorithms=[
            learners.get(agent) or MARLRandomDiscreteMaskedOffPolicyAlgorithm(env.action_space)
            for agent in env.agents
        ],
        env=env,
    )
