"""Identical spaces for every agent, PettingZoo's ``{"observation", "action_mask"}`` convention: what Tianshou needs.

Tianshou's ``tianshou.env.PettingZooEnv`` (``tianshou/env/pettingzoo_env.py``, 2.0) asserts that every agent
has the *same* observation space and the *same* action space, and reads the legal actions from
``observation["action_mask"]`` next to ``observation["observation"]`` (the PettingZoo classic-games
convention, also used by AgileRL and SuperSuit's padding wrappers). drmas agents differ: a Verifier picks
among 2 protocol texts, a router among 2 others, a writer among its own candidates.

:class:`MaskedSpaces` presents, for every agent:

==================  ==============================================  =========  ======================================
key / action        space (one object shared by all agents)          dtype      meaning
==================  ==============================================  =========  ======================================
``observation``     ``gymnasium.spaces.flatten_space`` of the        as flat    the wrapped observation without its
                    wrapped observation minus ``action_mask``                   ``action_mask``, flattened (Dict keys
                                                                               in gymnasium's sorted order)
``action_mask``     ``Box(0, 1, (N,))``                             int8       1 = legal; ``N`` = the largest choice
                                                                               count; padding choices are 0
action              ``Discrete(N)``                                  int64      choice index, checked against the mask
==================  ==============================================  =========  ======================================

Every agent's wrapped action space must be ``Discrete`` (stack :class:`~drmas_envs.wrappers.DiscreteChoices`
underneath: a Verifier's approve/reject, a writer's candidate texts) and every agent's flattened observation
space must be the same (:class:`~drmas_envs.wrappers.TokenSpaces` gives that). Only the acting agent steps
(AEC), so Tianshou's multi-agent policy dispatches each transition to that agent's policy alone.

Example:
    >>> env = DiscreteChoices(drmas_envs.make("math-solver-verifier-v0"),
    ...                       {"solver": [r"\\boxed{0}", r"\\boxed{1}"], "verifier": VERIFIER_CHOICES})
    >>> env = MaskedSpaces(TokenSpaces(env, tokenizer, 64, 8, pad_id=pad))
    >>> tianshou.env.PettingZooEnv(env)     # identical spaces: accepted
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

__all__ = ["MaskedSpaces"]


class MaskedSpaces(BaseWrapper):
    """AEC wrapper: one shared ``Dict(observation, action_mask)`` space and one ``Discrete(N)`` for all agents.

    Args:
        env: a drmas env wrapped so that every agent's action space is ``Discrete`` and every agent's
            observation (minus ``action_mask``) flattens to the same space.

    Raises:
        ValueError: an agent's action space is not ``Discrete`` (the message names it and points to
            ``DiscreteChoices``), or two agents' flattened observation spaces differ.
    """

    def __init__(self, env: AECEnv) -> None:
        super().__init__(env)
        self._inner_obs: dict[str, spaces.Space] = {}
        self._n: dict[str, int] = {}
        flat_spaces: dict[str, spaces.Space] = {}
        for agent in env.possible_agents:
            act = env.action_space(agent)
            if not isinstance(act, spaces.Discrete) or int(act.start) != 0:
                raise ValueError(
                    f"MaskedSpaces needs a Discrete action space (starting at 0) for every agent; agent {agent!r} "
                    f"has {act}. Give it choices first: DiscreteChoices(env, {{{agent!r}: [text, ...]}})"
                )
            self._n[agent] = int(act.n)
            obs = env.observation_space(agent)
            inner = (
                spaces.Dict({k: s for k, s in obs.spaces.items() if k != "action_mask"})
                if isinstance(obs, spaces.Dict)
                else obs
            )
            self._inner_obs[agent] = inner
            flat_spaces[agent] = spaces.flatten_space(inner)
        first = env.possible_agents[0]
        for agent, flat in flat_spaces.items():
            if flat != flat_spaces[first]:
                raise ValueError(
                    f"agents {first!r} and {agent!r} observe different spaces once flattened ({flat_spaces[first]} "
                    f"vs {flat}); wrap the env in TokenSpaces (same token arrays for every agent) first"
                )
        self.num_actions = max(self._n.values())
        self._action_space = spaces.Discrete(self.num_actions)
        self._observation_space = spaces.Dict(
            {
                "observation": flat_spaces[first],
                "action_mask": spaces.Box(0, 1, (self.num_actions,), dtype=np.int8),
            }
        )

    def observation_space(self, agent: str) -> spaces.Dict:
        """``Dict(observation, action_mask)``: the same object for every agent."""
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Discrete:
        """``Discrete(N)``: the same object for every agent."""
        return self._action_space

    def action_mask(self, agent: str) -> np.ndarray:
        """``(N,)`` int8: the wrapped mask (or all ones) over the agent's own choices, 0 for the padding."""
        return self._mask(agent, self.env.observe(agent))

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        """``{"observation": flat array, "action_mask": (N,) int8}`` of ``agent``."""
        inner = self.env.observe(agent)
        body = {k: v for k, v in inner.items() if k != "action_mask"} if isinstance(inner, dict) else inner
        return {"observation": spaces.flatten(self._inner_obs[agent], body), "action_mask": self._mask(agent, inner)}

    def _mask(self, agent: str, inner: Any) -> np.ndarray:
        mask = np.zeros(self.num_actions, dtype=np.int8)
        own = inner.get("action_mask") if isinstance(inner, dict) else None
        mask[: self._n[agent]] = 1 if own is None else np.asarray(own, dtype=np.int8)
        return mask

    def step(self, action: Any) -> None:
        """Pass a legal choice index (or a dead step's ``None``) to the wrapped env.

        Raises:
            ValueError: ``action`` is not an integer index of a legal choice of the acting agent.
        """
        agent = self.env.agent_selection
        done = self.env.terminations.get(agent, False) or self.env.truncations.get(agent, False)
        if action is not None and not done:
            index = np.asarray(action)
            if index.shape not in ((), (1,)) or not np.issubdtype(index.dtype, np.integer):
                raise ValueError(f"action of agent {agent!r} must be an integer choice index, got {action!r}")
            i = int(index.reshape(()))
            if not 0 <= i < self._n[agent] or not self.action_mask(agent)[i]:
                raise ValueError(
                    f"action {i} of agent {agent!r} is masked out: its legal choices are "
                    f"{np.flatnonzero(self.action_mask(agent)).tolist()} of Discrete({self.num_actions})"
                )
            action = i
        self.env.step(action)
