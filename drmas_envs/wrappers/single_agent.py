"""A Gymnasium single-agent view of a drmas env: control one agent, the others play given policies.

Single-agent trainers (anything that speaks ``gymnasium.Env``: Stable-Baselines-style loops, vector envs,
``check_env``) can train one role of a multi-agent system while the other roles are played by fixed
policies (a frozen LLM, a rule, a random policy). :class:`SingleAgentEnv` does the AEC bookkeeping:
after each action of the controlled agent it plays the others (and PettingZoo's dead steps) until it is
the controlled agent's turn again or the episode is over.

Reward of one ``step``: the sum of the controlled agent's AEC step rewards from its action up to its next
turn (its format penalty at once, the episode reward ``R`` at the end). So an episode's return equals the
agent's drmas return ``R - format_penalty * invalid calls``.

Every drmas registry id ``X`` is also registered in Gymnasium's registry as ``drmas/X`` (when this module
is imported; :func:`register_gymnasium_envs` picks up ids registered later), so::

    >>> import gymnasium, drmas_envs.wrappers
    >>> env = gymnasium.make("drmas/math-solver-verifier-v0", agent_id="verifier",
    ...                      others={"solver": my_solver_policy})
    >>> gymnasium.utils.env_checker.check_env(env.unwrapped)

A policy is any callable ``policy(observation) -> action`` in the wrapped env's spaces; if it has a
``reset(seed=...)`` method, it is called at every episode start with a seed drawn from this env's
``np_random``, so seeded episodes replay exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import AECEnv

import drmas_envs.registration as drmas_registration

__all__ = [
    "Policy",
    "RandomPolicy",
    "SingleAgentEnv",
    "make_single_agent_env",
    "register_gymnasium_envs",
    "GYMNASIUM_NAMESPACE",
]

#: Gymnasium namespace of the mirrored ids: ``gymnasium.make("drmas/<drmas id>")``.
GYMNASIUM_NAMESPACE = "drmas"

#: ``policy(observation) -> action`` for one agent, in the (possibly wrapped) env's spaces.
Policy = Callable[[Any], Any]


class RandomPolicy:
    """Samples a uniform action from ``space`` (respecting ``observation["action_mask"]`` when present).

    Keeps its own copy of the space so sampling never disturbs the env's space objects; seeded by
    :meth:`reset`.
    """

    def __init__(self, space: gymnasium.spaces.Space) -> None:
        self.space = copy.deepcopy(space)

    def reset(self, seed: int | None = None) -> None:
        """Seed the sampler."""
        self.space.seed(seed)

    def __call__(self, observation: Any) -> Any:
        mask = observation.get("action_mask") if isinstance(observation, dict) else None
        if mask is not None and isinstance(self.space, gymnasium.spaces.Discrete):
            return self.space.sample(mask=np.asarray(mask, dtype=np.int8))
        return self.space.sample()


class SingleAgentEnv(gymnasium.Env):
    """``gymnasium.Env`` controlling ``agent_id`` of a drmas AEC env; see the module docstring.

    Args:
        env: a drmas env, possibly wrapped (TokenSpaces, DiscreteChoices, ...). Its spaces for ``agent_id``
            become this env's ``observation_space`` and ``action_space``.
        agent_id: the controlled agent (one of ``env.possible_agents``).
        others: agent id -> :data:`Policy` for every other agent, or ``"random"`` (a :class:`RandomPolicy`
            each), or a mapping in which the value ``"random"`` stands for one.
        max_reset_attempts: ``reset`` redraws the episode when it ends before ``agent_id`` acts; after
            this many tries it raises.

    Raises:
        ValueError: unknown ``agent_id``, a policy for an unknown agent, a missing policy, or
            ``max_reset_attempts < 1``.
        TypeError: ``env`` is not an AEC env or a policy is not callable.
    """

    def __init__(
        self,
        env: AECEnv,
        agent_id: str,
        others: Mapping[str, Policy | str] | str = "random",
        *,
        max_reset_attempts: int = 100,
    ) -> None:
        if not isinstance(env, AECEnv):
            raise TypeError(
                f"SingleAgentEnv expects a PettingZoo AECEnv (a drmas env), got {type(env).__name__}"
            )
        agents = list(env.possible_agents)
        if agent_id not in agents:
            raise ValueError(f"unknown agent_id {agent_id!r}; the env's agents are {agents}")
        if (
            isinstance(max_reset_attempts, bool)
            or not isinstance(max_reset_attempts, int)
            or max_reset_attempts < 1
        ):
            raise ValueError(f"max_reset_attempts must be an int >= 1, got {max_reset_attempts!r}")
        if isinstance(others, str):
            if others != "random":
                raise ValueError(f"others must be 'random' or a dict {{agent_id: policy}}, got {others!r}")
            others = dict.fromkeys((a for a in agents if a != agent_id), "random")
        if not isinstance(others, Mapping):
            raise TypeError(
                f"others must be 'random' or a dict {{agent_id: policy}}, got {type(others).__name__}"
            )
        unknown = sorted(set(others) - set(agents) - {agent_id})
        if unknown or agent_id in others:
            bad = unknown or [agent_id]
            raise ValueError(
                f"others has policies for {bad}, which are not other agents of the env ({agents})"
            )
        missing = [a for a in agents if a != agent_id and a not in others]
        if missing:
            raise ValueError(
                f"no policy for agents {missing}: give others={{agent: policy}} or others='random'"
            )
        self.policies: dict[str, Policy] = {}
        for agent, policy in others.items():
            if isinstance(policy, str) and policy == "random":
                policy = RandomPolicy(env.action_space(agent))
            if not callable(policy):
                raise TypeError(
                    f"policy for agent {agent!r} must be callable(observation) -> action, got {policy!r}"
                )
            self.policies[agent] = policy

        self.env = env
        self.agent_id = agent_id
        self.max_reset_attempts = max_reset_attempts
        self.observation_space = env.observation_space(agent_id)
        self.action_space = env.action_space(agent_id)
        self.render_mode = getattr(env, "render_mode", None)
        self.metadata = {
            "render_modes": list(getattr(env, "metadata", {}).get("render_modes", [])),
            "render_fps": 1,
        }
        self._needs_reset = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Start an episode (``options`` go to the drmas env, e.g. ``{"task_index": 3}``) and play the others
        until ``agent_id``'s first turn.

        Raises:
            RuntimeError: ``max_reset_attempts`` episodes in a row ended before ``agent_id`` could act.
        """
        super().reset(seed=seed)
        for attempt in range(self.max_reset_attempts):
            self.env.reset(seed=seed if attempt == 0 else None, options=options)
            for policy in self.policies.values():
                if callable(getattr(policy, "reset", None)):
                    policy.reset(seed=int(self.np_random.integers(2**31 - 1)))
            self._advance()
            if not self._agent_done():
                self._needs_reset = False
                return self.env.observe(self.agent_id), copy.deepcopy(self.env.infos[self.agent_id])
        raise RuntimeError(
            f"{self.max_reset_attempts} episodes in a row ended before agent {self.agent_id!r} could act "
            f"(options={options!r}); check the other agents' policies or raise max_reset_attempts"
        )

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Apply ``agent_id``'s action, then play the others until its next turn or the end.

        Raises:
            RuntimeError: called before ``reset`` or after the episode ended.
            the drmas env's own errors for a malformed action (e.g. TypeError for a non-str text action).
        """
        if self._needs_reset:
            raise RuntimeError(
                "SingleAgentEnv.step() called before reset() or after the episode ended; call reset()"
            )
        self.env.step(action)
        reward = float(self.env.rewards.get(self.agent_id, 0.0))
        reward += self._advance()
        terminated = bool(self.env.terminations[self.agent_id])
        truncated = bool(self.env.truncations[self.agent_id])
        self._needs_reset = terminated or truncated
        obs = self.env.observe(self.agent_id)
        return obs, reward, terminated, truncated, copy.deepcopy(self.env.infos[self.agent_id])

    def _agent_done(self) -> bool:
        env = self.env
        return (
            self.agent_id not in env.agents
            or env.terminations[self.agent_id]
            or env.truncations[self.agent_id]
        )

    def _advance(self) -> float:
        """Play other agents until ``agent_id`` must act or is done; return its reward meanwhile."""
        env, total = self.env, 0.0
        while env.agents and not self._agent_done():
            selected = env.agent_selection
            if selected == self.agent_id:
                break
            if env.terminations[selected] or env.truncations[selected]:
                env.step(None)  # PettingZoo's dead step
                continue
            env.step(self.policies[selected](env.observe(selected)))
            total += float(env.rewards.get(self.agent_id, 0.0))
        return total

    def render(self) -> Any:
        """The drmas env's render output (the transcript with ``render_mode="ansi"``)."""
        return self.env.render()

    def close(self) -> None:
        """Close the drmas env (safe to call more than once)."""
        self.env.close()


def make_single_agent_env(
    env_id: str,
    agent_id: str | None = None,
    others: Mapping[str, Policy | str] | str = "random",
    *,
    render_mode: str | None = None,
    aec_wrappers: Iterable[Callable[[AECEnv], AECEnv]] = (),
    max_reset_attempts: int = 100,
    **env_kwargs: Any,
) -> SingleAgentEnv:
    """Build ``SingleAgentEnv(aec_wrappers(drmas_envs.make(env_id, **env_kwargs)), agent_id, others)``.

    The entry point of every ``drmas/<id>`` Gymnasium id. ``agent_id`` defaults to the env's first agent;
    ``aec_wrappers`` are applied in order to the AEC env (e.g. ``[lambda e: TokenSpaces(e, tok, 256, 32)]``).

    Raises:
        the registry's lookup errors for an unknown ``env_id``, and :class:`SingleAgentEnv`'s errors.
    """
    if render_mode is not None:
        env_kwargs["render_mode"] = render_mode
    aec = drmas_registration.make(env_id, **env_kwargs)
    for wrap in aec_wrappers:
        aec = wrap(aec)
    return SingleAgentEnv(
        aec,
        aec.possible_agents[0] if agent_id is None else agent_id,
        others,
        max_reset_attempts=max_reset_attempts,
    )


def gymnasium_id(env_id: str) -> str:
    """Gymnasium id of a drmas id: ``"drmas/<id>"`` (an id that already has a namespace keeps it)."""
    namespace, _, _ = drmas_registration.parse_env_id(env_id)
    return env_id if namespace is not None else f"{GYMNASIUM_NAMESPACE}/{env_id}"


def register_gymnasium_envs() -> list[str]:
    """Register every drmas id not yet in Gymnasium's registry as ``drmas/<id>``; return the new ids.

    Idempotent: call it again after registering more drmas envs.
    """
    added = []
    for env_id in sorted(drmas_registration.registry):
        gym_id = gymnasium_id(env_id)
        if gym_id in gymnasium.registry:
            continue
        gymnasium.register(id=gym_id, entry_point=make_single_agent_env, kwargs={"env_id": env_id})
        added.append(gym_id)
    return added
