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

Which signal a trainer acts on (so that no trainer counts a non-acting agent's no-op as a decision):

- RLlib ``ParallelPettingZooEnv``: ``to_parallel(env, acting_only=True)``. RLlib's ``MultiAgentEnv`` contract:
  the agents in a step's observation dict are the ones that act next; the others only collect rewards.
- RLlib ``PettingZooEnv`` and Tianshou's ``PettingZooEnv``: the AEC env itself (``agent_selection``: one agent
  per step; Tianshou also needs :class:`~drmas_envs.wrappers.MaskedSpaces`).
- TorchRL ``PettingZooWrapper``: the AEC env with ``use_mask=True`` (``(group, "mask")`` is the acting agent).
  Its parallel mode marks every *live* agent in ``mask``, so there the learner must mask by ``is_acting``.
- PettingZoo's ``parallel_api_test`` and all-agent batch learners: ``to_parallel(env)`` (the default): every
  live agent is observed every step and ``infos[agent]["is_acting"]`` says who acts.

With ``acting_only=True`` a step's observations and infos hold only the agent(s) whose turn is next (every
agent on the step that ends the episode: their final observations), rewards / terminations / truncations hold
every agent that was alive, and an action for an agent whose turn it is not raises ``ValueError`` instead of
being dropped. Parallel libraries that need every live agent in every observation dict (``parallel_api_test``
samples an action for each) must use the default view and mask by ``is_acting``.

PettingZoo's own :func:`pettingzoo.utils.conversions.aec_to_parallel` steps every agent once per cycle from
observations taken *before* the cycle, so a drmas Verifier would judge the previous answer, and envs whose
turn order is not a fixed cycle (``search-orchestrator-v0``, ``math-generator-verifier-refiner-v0``) fail
mid-episode. drmas envs therefore refuse it up front with a ``TypeError`` naming :func:`to_parallel`
(``drmas_envs.core.parallelizable``).
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
        acting_only: observe only the agent(s) whose turn is next (RLlib's ``MultiAgentEnv`` contract, see
            the module docstring); ``False`` (default) observes every live agent (PettingZoo's
            ``parallel_api_test``).

    Step semantics:
        ``step(actions)`` applies ``actions[agent_selection]`` to the AEC env, then plays the dead steps
        (``None`` actions) that PettingZoo's AEC API requires once agents are done. Returned rewards are
        the AEC env's per-step ``rewards`` (so the end-of-episode reward reaches every agent on the last
        step), observations cover every agent alive before the step, and ``infos[agent]["is_acting"]`` says
        whose action the *next* ``step`` will apply.

    Raises (from ``step``):
        KeyError: the acting agent has no entry in ``actions`` (the message names it).
        ValueError: with ``acting_only=True``, ``actions`` has an entry for an agent whose turn it is not.
        TypeError: ``actions`` is not a mapping.
    """

    def __init__(self, aec_env: AECEnv, *, acting_only: bool = False) -> None:
        if not isinstance(aec_env, AECEnv):
            raise TypeError(
                f"to_parallel expects a PettingZoo AECEnv (e.g. a drmas env), got {type(aec_env).__name__}"
            )
        if not isinstance(acting_only, bool):
            raise TypeError(f"acting_only must be a bool, got {acting_only!r}")
        self.aec_env = aec_env
        self.acting_only = acting_only
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

    @property
    def acting_agents(self) -> list[str]:
        """Agents whose action the next :meth:`step` applies: ``[agent_selection]``, or ``[]`` once done."""
        return [self.aec_env.agent_selection] if self.agents else []

    # ---- API ----
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Reset the AEC env; return ``(observations, infos)`` for every agent."""
        self.aec_env.reset(seed=seed, options=options)
        self.agents = list(self.aec_env.agents)
        observed = self.acting_agents if self.acting_only else self.agents
        observations = {a: self.aec_env.observe(a) for a in observed}
        return observations, self._infos(observed)

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
        if self.acting_only and len(actions) > 1:
            raise ValueError(
                f"acting_only=True: only agent {acting!r} acts this step (the one observed), got actions for "
                f"{sorted(actions)}; an action for a non-acting agent would be a no-op counted as a decision"
            )
        before = list(self.agents)
        self.aec_env.step(actions[acting])
        rewards = {a: float(self.aec_env.rewards.get(a, 0.0)) for a in before}
        terminations = {a: bool(self.aec_env.terminations.get(a, False)) for a in before}
        truncations = {a: bool(self.aec_env.truncations.get(a, False)) for a in before}
        episode_over = all(terminations[a] or truncations[a] for a in before)
        if self.acting_only and not episode_over:
            observed = [a for a in self.acting_agents if not (terminations[a] or truncations[a])]
        else:
            observed = before
        observations = {a: self.aec_env.observe(a) for a in observed}
        infos = self._infos(observed)
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


def to_parallel(env: AECEnv, *, acting_only: bool = False) -> TurnBasedParallelEnv:
    """Parallel-API view of a drmas AEC env (turn-based; non-acting agents' actions are no-ops).

    With ``acting_only=False`` it passes :func:`pettingzoo.test.parallel_api_test`; with ``acting_only=True``
    only the acting agent is observed and may act (RLlib). See the module docstring and
    :class:`TurnBasedParallelEnv`.

    Raises:
        TypeError: ``env`` is not a PettingZoo AECEnv, or ``acting_only`` is not a bool.
    """
    return TurnBasedParallelEnv(env, acting_only=acting_only)
