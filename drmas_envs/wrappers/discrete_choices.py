"""Categorical actions for agents whose decision is a choice among fixed texts.

Some drmas agents really make a categorical decision wrapped in text: the math Verifier approves or
rejects (``<verify>approve</verify>`` / ``<verify>reject</verify>``), the search router says whether the
evidence suffices (``<verify>yes</verify>`` / ``<verify>no</verify>``). :class:`DiscreteChoices` gives such
agents a ``Discrete(n)`` action space: action ``i`` submits ``choices[agent][i]`` verbatim, in the text
protocol the env already parses. Their observation gains an ``action_mask`` (``int8``, ``(n,)``, all ones:
every choice is always legal), PettingZoo's convention, which TorchRL, Tianshou and ``api_test`` read.

Example:
    >>> env = DiscreteChoices(drmas_envs.make("math-solver-verifier-v0"), {"verifier": VERIFIER_CHOICES})
    >>> env.action_space("verifier")
    Discrete(2)

Stack it *inside* :class:`~drmas_envs.wrappers.TokenSpaces` (``TokenSpaces(DiscreteChoices(env, ...), ...)``):
it needs the wrapped agent's action to be text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

__all__ = ["DiscreteChoices", "ROUTER_CHOICES", "VERIFIER_CHOICES"]

#: The math Verifier's decisions (``math-solver-verifier-v0``): action 0 approves, 1 rejects.
VERIFIER_CHOICES: tuple[str, ...] = ("<verify>approve</verify>", "<verify>reject</verify>")
#: The search router's decisions (``search-orchestrator-v0`` agent ``verifier``): 0 = enough evidence, 1 = search more.
ROUTER_CHOICES: tuple[str, ...] = ("<verify>yes</verify>", "<verify>no</verify>")


class DiscreteChoices(BaseWrapper):
    """AEC wrapper giving chosen agents a ``Discrete(n)`` action that renders to fixed text.

    Args:
        env: a drmas env (possibly wrapped) whose chosen agents take text actions.
        choices: agent id -> the ``n >= 1`` distinct texts it may submit; action ``i`` submits ``choices[i]``.

    Observation of a chosen agent: the wrapped observation dict plus ``"action_mask"`` (``(n,)`` int8,
    all ones); a non-dict observation ``o`` becomes ``{"observation": o, "action_mask": ...}``. Other agents
    are untouched.

    Raises:
        ValueError: an unknown agent, an empty or duplicated choice list, or a non-str choice.
        TypeError: a chosen agent's wrapped action space is not text (wrap DiscreteChoices first).
    """

    def __init__(self, env: AECEnv, choices: Mapping[str, Sequence[str]]) -> None:
        super().__init__(env)
        if not isinstance(choices, Mapping) or not choices:
            raise ValueError(f"choices must be a non-empty dict {{agent_id: [text, ...]}}, got {choices!r}")
        self.choices: dict[str, tuple[str, ...]] = {}
        for agent, texts in choices.items():
            if agent not in env.possible_agents:
                raise ValueError(
                    f"unknown agent {agent!r} in choices; the env's agents are {list(env.possible_agents)}"
                )
            if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
                raise ValueError(f"choices[{agent!r}] must be a non-empty list of str, got {texts!r}")
            if not all(isinstance(t, str) for t in texts):
                raise ValueError(f"choices[{agent!r}] must contain only str, got {texts!r}")
            if len(set(texts)) != len(texts):
                raise ValueError(f"choices[{agent!r}] has duplicates: {list(texts)}")
            if not isinstance(env.action_space(agent), spaces.Text):
                raise TypeError(
                    f"agent {agent!r} does not take text actions here (action space {env.action_space(agent)}); "
                    "apply DiscreteChoices to the text env first, e.g. TokenSpaces(DiscreteChoices(env, ...), ...)"
                )
            self.choices[agent] = tuple(texts)
        self._action_spaces = {a: spaces.Discrete(len(t)) for a, t in self.choices.items()}
        self._observation_spaces: dict[str, spaces.Dict] = {}
        for agent, texts in self.choices.items():
            inner = env.observation_space(agent)
            mask = spaces.Box(0, 1, (len(texts),), dtype=np.int8)
            base = dict(inner.spaces) if isinstance(inner, spaces.Dict) else {"observation": inner}
            self._observation_spaces[agent] = spaces.Dict({**base, "action_mask": mask})

    def observation_space(self, agent: str) -> spaces.Space:
        """Wrapped space plus ``action_mask`` for chosen agents; the wrapped space otherwise."""
        return self._observation_spaces[agent] if agent in self.choices else self.env.observation_space(agent)

    def action_space(self, agent: str) -> spaces.Space:
        """``Discrete(n)`` for chosen agents; the wrapped space otherwise."""
        return self._action_spaces[agent] if agent in self.choices else self.env.action_space(agent)

    def action_mask(self, agent: str) -> np.ndarray:
        """Legal choices of ``agent`` now: ``(n,)`` int8, 1 = legal (every choice is always legal)."""
        return np.ones(len(self.choices[agent]), dtype=np.int8)

    def observe(self, agent: str) -> Any:
        """Wrapped observation, plus ``action_mask`` for chosen agents."""
        obs = self.env.observe(agent)
        if agent not in self.choices:
            return obs
        base = dict(obs) if isinstance(obs, dict) else {"observation": obs}
        return {**base, "action_mask": self.action_mask(agent)}

    def text_of(self, agent: str, action: Any) -> str:
        """The text that ``action`` (a choice index) renders to for ``agent``.

        Raises:
            ValueError: ``action`` is not an integer in ``[0, n)``.
        """
        index = np.asarray(action)
        if index.shape not in ((), (1,)) or not np.issubdtype(index.dtype, np.integer):
            raise ValueError(
                f"action of agent {agent!r} must be an integer choice index in [0, {len(self.choices[agent])}), "
                f"got {action!r}"
            )
        i = int(index.reshape(()))
        if not 0 <= i < len(self.choices[agent]):
            raise ValueError(
                f"action of agent {agent!r} must be in [0, {len(self.choices[agent])}) "
                f"(choices {list(self.choices[agent])}), got {i}"
            )
        return self.choices[agent][i]

    def step(self, action: Any) -> None:
        """Render a chosen agent's index into its text; pass other actions (and dead-step ``None``) through."""
        agent = self.env.agent_selection
        if action is not None and agent in self.choices and not self._is_done(agent):
            action = self.text_of(agent, action)
        self.env.step(action)

    def _is_done(self, agent: str) -> bool:
        return bool(self.env.terminations.get(agent, False) or self.env.truncations.get(agent, False))
