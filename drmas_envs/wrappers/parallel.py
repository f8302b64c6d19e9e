"""A PettingZoo *Parallel* view of any drmas AEC env (turn-based: one agent acts per step).

drmas envs are turn-based conversations: exactly one agent speaks at a time. Parallel-API libraries
(TorchRL's ``PettingZooWrapper`` in parallel mode, BenchMARL, SuperSuit vector envs, AgileRL) want every
live agent to submit an action each step. :func:`to_parallel` maps one parallel step to one AEC step:
only the action of the agent whose turn it is (``infos[agent]["is_acting"]``, also
:attr:`TurnBasedParallelEnv.agent_selection`) takes effect; everyone else's action is a no-op and may be
omitted. Agents stay in ``agents`` until the episode ends, and all of them leave on the same step.

Example:
    >>> from drmas_envs.wrappers import to_parallel
    >>> par = to_parallel(aec_env)                         # any drmas env, wrapped or not
    >>> obs, infos = par.reset(seed=0)
    >>> while par.agents:
    ...     acting = par.agent_selection
    ...     obs, rewards, terms, truncs, infos = par.step({acting: policy(obs[acting])})

Unlike :func:`pettingzoo.utils.conversions.turn_based_aec_to_parallel`, this view never mutates the
wrapped env's ``infos`` (it returns copies), reports who acts next as a bool (``is_acting``) instead of a
string so numeric libraries can tensorise infos, and raises a clear error when the acting agent's action
is missing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium
from pettingzoo import AECEnv, ParallelEnv

__all__ = ["TurnBasedParallelEnv", "to_parallel"]


class TurnBasedParallelEnv(ParallelEnv):
    """Parallel-API view of a turn-based AEC env; see the module docstring.

    Args:
        aec_env: any PettingZoo AEC env in which one agent acts at a time (every drmas env, wrapped or not).

    Step semantics:
        ``step(actions)`` applies ``actions[agent_selection]`` to the AEC env, then plays the dead steps
        (``None`` actions) that PettingZoo's AEC API requires once agents are done. Returned rewards are
        the AEC env's per-step ``rewards`` (so the end-of-episode reward reaches every agent on the last
        step), observations cover every agent alive before the step, and ``infos[agent]["is_acting"]`` says
        whose action the *next* ``step`` will apply.

    Raises (from ``step``):
        KeyError: the acting agent has no entry in ``actions`` (the message names it).
        TypeError: ``actions`` is not a mapping.
    """

    def __init__(self, aec_env: AECEnv) -> None:
        if not isinstance(aec_env, AECEnv):
            raise TypeError(
                f"to_parallel expects a PettingZoo AECEnv (e.g. a drmas env), got {type(aec_env).__name__}"
            )
        self.aec_env = aec_env
        self.possible_agents = list(aec_env.possible_agents)
        self.metadata = dict(getattr(aec_env, "metadata", {}))
        self.render_mode = getattr(aec_env, "render_mode", None)
        self.agents: list[str] = []

    # ---- spaces: the AEC env's own (identity-stable) objects ----
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        """The wrapped env's observation space of ``agent`` (the same object every call)."""
        return self.aec_env.observation_space(agent)

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        """The wrapped env's action space of ``agent`` (the same object every call)."""
        return self.aec_env.action_space(agent)

    @property
    def agent_selection(self) -> str:
        """The agent whose action the next :meth:`step` applies."""
        return self.aec_env.agent_selection

    # ---- API ----
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Reset the AEC env; return ``(observations, infos)`` for every agent."""
        self.aec_env.reset(seed=seed, options=options)
        self.agents = list(self.aec_env.agents)
        observations = {a: self.aec_env.observe(a) for a in self.agents}
        return observations, self._infos(self.agents)

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        """Apply the acting agent's action; see the class docstring for the returned dicts."""
        if not isinstance(actions, Mapping):
            raise TypeError(f"actions must be a dict {{agent: action}}, got {type(actions).__name__}")
        if not self.agents:
            return {}, {}, {}, {}, {}
        acting = self.aec_env.agent_selection
        if acting not in actions:
            raise KeyError(
                f"no action for agent {acting!r}, whose turn it is (see env.agent_selection or "
                f"infos[agent]['is_acting']); got actions for {sorted(actions)}"
            )
        before = list(self.agents)
        self.aec_env.step(actions[acting])
        rewards = {a: float(self.aec_env.rewards.get(a, 0.0)) for a in before}
        terminations = {a: bool(self.aec_env.terminations.get(a, False)) for a in before}
        truncations = {a: bool(self.aec_env.truncations.get(a, False)) for a in before}
        observations = {a: self.aec_env.observe(a) for a in before}
        infos = self._infos(before)
        # PettingZoo's AEC API makes each done agent take one dead step (action None) before it leaves.
        while self.aec_env.agents:
            selected = self.aec_env.agent_selection
            if not (self.aec_env.terminations[selected] or self.aec_env.truncations[selected]):
                break
            self.aec_env.step(None)
        self.agents = list(self.aec_env.agents)
        return observations, rewards, terminations, truncations, infos

    def _infos(self, agents: list[str]) -> dict[str, dict[str, Any]]:
        acting = self.aec_env.agent_selection if self.aec_env.agents else None
        return {a: {**copy.deepcopy(self.aec_env.infos.get(a, {})), "is_acting": a == acting} for a in agents}

    def render(self) -> Any:
        """The wrapped env's render output (the transcript for drmas envs)."""
        return self.aec_env.render()

    def state(self) -> Any:
        """The wrapped env's global state (drmas text envs define none and raise NotImplementedError)."""
        return self.aec_env.state()

    def close(self) -> None:
        """Close the wrapped env."""
        self.aec_env.close()

    def __str__(self) -> str:
        return f"TurnBasedParallelEnv<{self.aec_env}>"


def to_parallel(env: AECEnv) -> TurnBasedParallelEnv:
    """Parallel-API view of a drmas AEC env (turn-based; non-acting agents' actions are no-ops).

    Passes :func:`pettingzoo.test.parallel_api_test`. See :class:`TurnBasedParallelEnv`.

    Raises:
        TypeError: ``env`` is not a PettingZoo AECEnv.
    """
    return TurnBasedParallelEnv(env)
