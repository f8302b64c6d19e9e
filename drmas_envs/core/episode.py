"""The episode record: one played episode, as the env saw it, for every consumer (training, eval, export).

A :class:`~drmas_envs.core.text_env.TextAECEnv` appends one :class:`CallRecord` per agent call to its
``history`` while the episode runs, and :meth:`TextAECEnv.episode_record` returns the finished episode as one
:class:`EpisodeRecord`: the calls in order (agent, the prompt messages it saw, its text, validity, format
penalty, per-call score) and the outcome (reward, won, metrics, truncation, per-agent returns) with the
:class:`~drmas_envs.core.task.Task` (id, data source, question, ground truth).

Consumers build their own shapes as views of this record: ``drmas_train.collect.rollout`` adds the token-level fields
(:class:`~drmas_train.collect.samples.Sample`), ``drmas_train.eval`` writes result rows and
:mod:`drmas_envs.wrappers.dataset_export` writes per-agent TRL rows. None of them reads env internals or
``infos`` keys. The AEC API is unchanged: the record is an addition.

Scores follow the Dr. MAS reference convention (``langfengQ/DrMAS``: every agent gets the episode reward ``R``,
each invalid call costs its agent ``format_penalty``): a call's score is ``R - penalty``, an agent's return is
``R - format_penalty * (its invalid calls)``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from drmas_envs.core.task import Task

__all__ = ["CallRecord", "EpisodeRecord", "episode_record", "play_episode"]


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One agent call: what the agent saw, what it said and the env's verdict.

    Attributes:
        agent_id: the acting agent.
        turn: index of the call in its episode (0-based, all agents); ``agent_turn`` among its agent's calls.
        prompt: the flat prompt text (``observe(agent)["prompt"]``) the agent saw.
        messages: the chat messages (``observe(agent)["messages"]``), ``({"role", "content"}, ...)``.
        text: the action text the env received.
        valid: whether the action followed the agent's protocol (``infos[agent]["is_action_valid"]``).
        penalty: the format penalty of this call (``0.0`` when valid), in reward units.
        info: the acting agent's step info (``infos[agent]`` after the call, before the episode's final fields).
        score: the call's score ``R - penalty`` (``R`` of its agent, :meth:`EpisodeRecord.reward_of`); ``None``
            while the episode runs (``R`` is not known yet).
    """

    agent_id: str
    turn: int
    agent_turn: int
    prompt: str
    messages: tuple[Mapping[str, str], ...]
    text: str
    valid: bool
    penalty: float
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    score: float | None = None

    # Names the older records used (``TurnRecord`` of env history, ``CallRecord`` of dataset export).
    @property
    def agent(self) -> str:
        """Alias of ``agent_id``."""
        return self.agent_id

    @property
    def completion(self) -> str:
        """Alias of ``text`` (the TRL column name)."""
        return self.text

    @property
    def is_action_valid(self) -> bool:
        """Alias of ``valid`` (the ``infos`` key)."""
        return self.valid

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists for tuples); :meth:`from_dict` is its inverse."""
        d = dataclasses.asdict(self)
        d["messages"] = [dict(m) for m in self.messages]
        d["info"] = dict(self.info)
        return d

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> CallRecord:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**row, "messages": tuple(dict(m) for m in row["messages"]), "info": dict(row["info"])})


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode: its task, its calls in order and its outcome.

    Attributes:
        task: the task played (``task_id``, ``data_source``, ``question``, ground truth ``answers``).
        agents: the env's ``possible_agents``, in role order.
        calls: every call, in order, each with its ``score`` set.
        reward: the episode reward ``R`` every agent receives at the end (before format penalties).
        won: whether the episode was solved (the env's :class:`~drmas_envs.core.text_env.Outcome`).
        metrics: the env's task-specific outcome fields (e.g. ``em``, ``f1``, ``num_searches``, ``prediction``).
        truncated: the episode ended by a step limit rather than terminating.
        returns: ``agent_id -> return``: ``R`` minus that agent's format penalties.
        traj_uid: the episode's id, set by whoever played it (the rollout engine, ``record_episode``);
            ``None`` as the env returns it.
        agent_rewards: ``agent_id -> R_agent`` (before penalties) where the agents' rewards differ by construction
            (games: each seat's game return; ``reward`` is then one reference agent's, see the env's card);
            empty (every other env): every agent receives ``reward``. Read it through :meth:`reward_of`.
    """

    task: Task
    agents: tuple[str, ...]
    calls: tuple[CallRecord, ...]
    reward: float
    won: bool
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    truncated: bool = False
    returns: Mapping[str, float] = dataclasses.field(default_factory=dict)
    traj_uid: str | None = None
    agent_rewards: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def reward_of(self, agent: str) -> float:
        """The episode reward ``agent`` received before penalties: ``agent_rewards[agent]``, else ``reward``.

        Raises:
            KeyError: ``agent`` is not one of ``agents``.
        """
        if agent not in self.agents:
            raise KeyError(f"agent {agent!r} is not in this episode's agents {list(self.agents)}")
        return float(self.agent_rewards.get(agent, self.reward))

    @property
    def task_id(self) -> str:
        """The task's id."""
        return self.task.task_id

    @property
    def data_source(self) -> str:
        """The task's benchmark tag."""
        return self.task.data_source

    @property
    def ground_truth(self) -> tuple[str, ...]:
        """The acceptable answers (``Task.answers``)."""
        return self.task.answers

    @property
    def score(self) -> float:
        """Alias of ``reward`` (the name of the Sample / infos field)."""
        return self.reward

    @property
    def num_turns(self) -> int:
        """Calls made in the episode, all agents."""
        return len(self.calls)

    def calls_per_agent(self) -> dict[str, int]:
        """``agent_id -> number of calls``, every agent of ``agents`` listed (0 when it never acted)."""
        counts = Counter(c.agent_id for c in self.calls)
        return {a: counts[a] for a in self.agents}

    def invalid_per_agent(self) -> dict[str, int]:
        """``agent_id -> number of invalid calls``, every agent of ``agents`` listed."""
        counts = Counter(c.agent_id for c in self.calls if not c.valid)
        return {a: counts[a] for a in self.agents}

    def with_traj_uid(self, traj_uid: str) -> EpisodeRecord:
        """A copy carrying ``traj_uid``."""
        return dataclasses.replace(self, traj_uid=traj_uid)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` is its inverse."""
        return {
            "task": self.task.to_dict(),
            "agents": list(self.agents),
            "calls": [c.to_dict() for c in self.calls],
            "reward": self.reward,
            "won": self.won,
            "metrics": dict(self.metrics),
            "truncated": self.truncated,
            "returns": dict(self.returns),
            "traj_uid": self.traj_uid,
            "agent_rewards": dict(self.agent_rewards),
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> EpisodeRecord:
        """Inverse of :meth:`to_dict`."""
        return cls(
            task=Task.from_dict(row["task"]),
            agents=tuple(row["agents"]),
            calls=tuple(CallRecord.from_dict(c) for c in row["calls"]),
            reward=float(row["reward"]),
            won=bool(row["won"]),
            metrics=dict(row["metrics"]),
            truncated=bool(row["truncated"]),
            returns=dict(row["returns"]),
            traj_uid=row.get("traj_uid"),
            agent_rewards={a: float(r) for a, r in row.get("agent_rewards", {}).items()},
        )


def episode_record(env: Any) -> EpisodeRecord:
    """The finished episode of ``env``, a drmas text env possibly inside wrappers (``env.unwrapped``).

    Raises:
        TypeError: ``env`` (unwrapped) has no ``episode_record()`` (not a drmas text env).
        RuntimeError: the episode is not over yet (from :meth:`TextAECEnv.episode_record`).
    """
    raw = getattr(env, "unwrapped", env)
    method = getattr(raw, "episode_record", None)
    if method is None:
        raise TypeError(f"{type(raw).__name__} is not a drmas text env: it has no episode_record()")
    return method()


def play_episode(
    env: Any,
    policies: Mapping[str, Callable[[Any], Any]],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    max_calls: int = 10_000,
) -> EpisodeRecord:
    """Play one episode of a drmas env (possibly wrapped) with one policy per agent; return its record.

    The standard AEC loop: reset, then for the selected agent either the dead step ``step(None)`` or
    ``step(policies[agent](env.observe(agent)))``, until no agent is left. Policies see (and return) what the
    outermost wrapper shows; the record holds what the text env saw and received.

    Args:
        env: a drmas text env, possibly inside PettingZoo wrappers (DiscreteChoices, TokenSpaces, ...).
        policies: agent id -> ``policy(observation) -> action`` for every agent that may act.
        seed, options: passed to ``env.reset``.
        max_calls: stop with an error after this many calls (guards against a non-terminating env).

    Raises:
        KeyError: an agent with no policy got the turn (the message names it).
        RuntimeError: the episode did not end within ``max_calls`` calls.
        TypeError: ``env`` is not a drmas text env (see :func:`episode_record`).
    """
    env.reset(seed=seed, options=options)
    calls = 0
    while env.agents:
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        if calls >= max_calls:
            raise RuntimeError(f"episode did not end within max_calls={max_calls} calls")
        if agent not in policies:
            raise KeyError(f"no policy for agent {agent!r}, whose turn it is; policies cover {sorted(policies)}")
        env.step(policies[agent](env.observe(agent)))
        calls += 1
    return episode_record(env)
