"""The text AEC base class shared by every drmas env.

A concrete env subclasses :class:`TextAECEnv` and implements four hooks; the base owns all PettingZoo
bookkeeping (declared below, rebuilt on every ``reset``), seeding, task choice, the dead-step guard,
action type checks, format penalties, infos and the ``ansi`` transcript.

Hooks (called by the base only):
    ``_start_episode() -> str``                 reset env-specific state for ``self.task``; return the first agent.
    ``_prompt(agent) -> tuple[str, str]``        (system, user) text the agent sees now.
    ``_act(agent, text) -> Turn``                apply one action; say whether it was valid and who acts next.
    ``_episode_outcome() -> Outcome``            episode reward and final info fields, called once at the end.

Reward convention (the Dr. MAS reference): at the end every agent receives the episode reward ``R``;
each *invalid* call costs its agent ``format_penalty`` at the step it was made. So an agent's cumulative
reward is ``R - format_penalty * (number of its invalid calls)``, and one call's own score is
``R - infos["penalty"]`` of that call. Where the agents' rewards differ by construction (games, where each seat
gets its own return), ``R`` is per agent, ``R_agent`` (:attr:`Outcome.rewards`); the rest is unchanged.

The played episode: ``history`` holds one :class:`~drmas_envs.core.episode.CallRecord` per call (with the
prompt the agent saw), and :meth:`TextAECEnv.episode_record` returns the finished episode as one
:class:`~drmas_envs.core.episode.EpisodeRecord`, the record every consumer reads.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from typing import Any

import gymnasium
from gymnasium.utils import seeding
from pettingzoo import AECEnv

from drmas_envs.core.episode import CallRecord, EpisodeRecord
from drmas_envs.core.parallelizable import NOT_PARALLELIZABLE
from drmas_envs.core.spaces import AnyText, observation_space
from drmas_envs.core.task import Task, TaskSource

__all__ = ["TextAECEnv", "Turn", "Outcome", "TurnRecord"]

_MAX_TEXT = sys.maxsize  # every str fits: observations may quote long LLM output verbatim


@dataclasses.dataclass
class Turn:
    """What ``_act`` reports about one agent call.

    Attributes:
        valid: whether the action followed the agent's output protocol (``is_action_valid``).
        next_agent: who acts next, or ``None`` when the episode is over.
        truncated: with ``next_agent=None``: the episode hit a step limit instead of terminating.
        info: extra, JSON-serialisable fields merged into the acting agent's ``infos`` for this step.
    """

    valid: bool
    next_agent: str | None
    truncated: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Outcome:
    """The end of an episode: reward ``reward`` for every agent plus ``won`` and task-specific fields.

    ``rewards`` (``agent_id -> reward``, every agent of ``possible_agents``) is for envs whose agents' rewards differ
    by construction (the games of :mod:`drmas_envs.games`: each seat gets its own game return): each agent then
    receives ``rewards[agent]`` instead of ``reward``, and ``reward``/``won`` describe one reference agent (the env
    says which). ``None`` (every other env): every agent receives ``reward``.
    """

    reward: float
    won: bool
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    rewards: dict[str, float] | None = None

    def reward_of(self, agent: str) -> float:
        """The episode reward ``agent`` receives: ``rewards[agent]`` when given, else ``reward``."""
        return float(self.reward if self.rewards is None else self.rewards[agent])


#: The entries of ``TextAECEnv.history`` (older name; ``.agent``, ``.text``, ``.valid``, ``.info`` still work).
TurnRecord = CallRecord


class TextAECEnv(AECEnv):
    """PettingZoo AEC env whose agents are LLM policies: text observations, free-text actions.

    Observation (per agent): ``{"prompt": str, "messages": [{"role", "content"}, ...]}``
    (:func:`drmas_envs.core.spaces.observation_space`). Action: any ``str``; one that breaks the agent's
    protocol is *invalid* (``infos[agent]["is_action_valid"] = False``, penalised), never an exception.

    Args:
        tasks: where episodes draw their task from (``reset`` picks one, see :meth:`reset`).
        format_penalty: reward subtracted from an agent for each of its invalid calls (>= 0).
        render_mode: ``None``, ``"ansi"`` (``render()`` returns the transcript) or ``"human"`` (the transcript is
            printed as the env steps, PettingZoo's convention: the task at ``reset``, each call after its ``step``,
            the returns when the episode ends; ``render()`` then prints only what was not shown yet).

    Raises:
        ValueError: unknown ``render_mode`` or negative ``format_penalty``.
    """

    # is_parallelizable: turn-based, so PettingZoo's aec_to_parallel raises a TypeError naming wrappers.to_parallel.
    # reference_env_step: what one env step of the Dr. MAS reference's multi-agent loop is, for GiGPO's discounted
    # step returns (drmas_train.algorithm.sample_advantages.gigpo_step_rewards): "round" (a new step when an agent
    # acts a second time; the search env) or "episode" (the whole episode is one step; the math envs).
    # per_agent_rewards (optional, absent = False): the agents' episode rewards differ by construction
    # (Outcome.rewards; the games): trainers then log and validate results per role.
    metadata: dict[str, Any] = {"render_modes": ["ansi", "human"], "name": "drmas_text_env",
                                "is_parallelizable": NOT_PARALLELIZABLE, "reference_env_step": "round"}  # fmt: skip

    # ---- bookkeeping, all rebuilt by reset() ----
    possible_agents: list[str]  # every agent that can ever act, in role order
    agents: list[str]  # agents still in the episode
    rewards: dict[str, float]  # reward of the last step, per agent
    _cumulative_rewards: dict[str, float]  # episode return so far, per agent (what last() returns)
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    agent_selection: str  # agent whose turn it is
    task: Task  # the task of the current episode
    rollout_index: int | None  # this episode's index g in [0, G) of its rollout group (reset option), or None
    history: list[CallRecord]  # every call of this episode, in order (score None until the end)
    num_turns: int  # calls made this episode (valid or not)
    episode_returns: dict[str, float]  # whole-episode return per agent (never reset mid-episode)
    _outcome: Outcome | None  # set when the episode ends
    _truncated: bool  # the episode ended by a step limit
    _shown: int  # transcript lines already printed in human render mode

    def __init__(
        self,
        tasks: TaskSource,
        *,
        format_penalty: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        super().__init__()
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        if not format_penalty >= 0:
            raise ValueError(f"format_penalty must be a number >= 0, got {format_penalty!r}")
        if len(tasks) == 0:
            raise ValueError("the task source is empty: give at least one task")
        self.tasks = tasks
        self.format_penalty = float(format_penalty)
        self.render_mode = render_mode
        self.agents = []
        self._has_reset = False
        self._shown = 0
        self._closed = False
        self._observation_space = observation_space(_MAX_TEXT)
        self._action_space = AnyText(_MAX_TEXT)
        self.observation_spaces = {a: self._observation_space for a in self.possible_agents}
        self.action_spaces = {a: self._action_space for a in self.possible_agents}
        self.np_random, self.np_random_seed = seeding.np_random(None)

    # ---- subclass hooks ----
    def _start_episode(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must implement _start_episode() -> first agent id")

    def _prompt(self, agent: str) -> tuple[str, str]:
        raise NotImplementedError(f"{type(self).__name__} must implement _prompt(agent) -> (system, user)")

    def _act(self, agent: str, text: str) -> Turn:
        raise NotImplementedError(f"{type(self).__name__} must implement _act(agent, text) -> Turn")

    def _episode_outcome(self) -> Outcome:
        raise NotImplementedError(f"{type(self).__name__} must implement _episode_outcome() -> Outcome")

    def role(self, agent: str) -> str:
        """Role name of ``agent`` (reported in infos); by default the agent id itself."""
        return agent

    # ---- PettingZoo API ----
    def observation_space(self, agent: str) -> gymnasium.spaces.Space:
        """The (identity-stable) observation space of ``agent``."""
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.spaces.Space:
        """The (identity-stable) action space of ``agent``: any ``str``."""
        return self.action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        """Start an episode.

        The task is, in order of precedence: ``options["task"]`` (a :class:`Task`), ``options["task_index"]``
        (an index into ``tasks``), else drawn with the env's own ``np_random`` (seeded by ``seed``). So a
        GRPO group replays one task ``n`` times with ``options={"task_index": i}``.

        ``options["rollout_index"]`` (an int >= 0; the rollout engine passes each episode's index g in [0, G) of
        its group) is kept in :attr:`rollout_index` (``None`` when not given) for envs that vary something across
        a group's rollouts on purpose (the games' ``opponent_seat="rotate"``: the learner's seat).

        Raises:
            ValueError: an index out of range, a ``task`` that is not a Task, or a ``rollout_index`` that is not an
                int >= 0. Other option keys are ignored.
        """
        if seed is not None:
            self.np_random, self.np_random_seed = seeding.np_random(seed)
        options = dict(options or {})
        # Other option keys are ignored, as Gymnasium/PettingZoo envs do (pettingzoo's api_test passes one).
        if "task" in options:
            if not isinstance(options["task"], Task):
                raise ValueError(f"options['task'] must be a drmas_envs Task, got {type(options['task']).__name__}")
            self.task = options["task"]
        elif "task_index" in options:
            index = options["task_index"]
            # numbers.Integral: numpy integers (e.g. from np.arange in a rollout loop) are valid indices too
            if isinstance(index, bool) or not isinstance(index, numbers.Integral) or not 0 <= index < len(self.tasks):
                raise ValueError(f"options['task_index'] must be an int in [0, {len(self.tasks)}), got {index!r}")
            self.task = self.tasks[int(index)]
        else:
            self.task = self.tasks[int(self.np_random.integers(len(self.tasks)))]
        index = options.get("rollout_index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, numbers.Integral) or index < 0):
            raise ValueError(f"options['rollout_index'] must be an int >= 0 (the episode's index in its group), "
                             f"got {index!r}")  # fmt: skip
        self.rollout_index = None if index is None else int(index)

        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.history = []
        self._outcome = None
        self._truncated = False
        self.num_turns = 0
        self.episode_returns = dict.fromkeys(self.agents, 0.0)
        self._skip_agent_selection = None
        self.infos = {a: self._base_info(a, valid=True) for a in self.agents}
        self.agent_selection = self._start_episode()
        self._has_reset = True
        self._shown = 0
        if self.render_mode == "human":
            self._print_new_lines()

    def observe(self, agent: str) -> dict[str, Any]:
        """The chat context ``agent`` sees now: ``{"prompt": str, "messages": [system, user]}``."""
        system, user = self._prompt(agent)
        return {
            "prompt": f"{system}\n\n{user}" if system else user,
            "messages": ({"role": "system", "content": system}, {"role": "user", "content": user})
            if system
            else ({"role": "user", "content": user},),
        }

    def step(self, action: Any) -> None:
        """Apply the current agent's text action.

        Raises:
            RuntimeError: if called before :meth:`reset`.
            TypeError: if a live agent's action is not a ``str`` (names the agent and the type).
            ValueError: if a terminated/truncated agent gets an action other than ``None``.
        """
        if not self._has_reset:
            raise RuntimeError(f"{type(self).__name__}.step() called before reset(); call env.reset(seed=...) first")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            if action is not None:
                raise ValueError(
                    f"agent {agent!r} is done (terminated or truncated); its only valid action is None, got {action!r}"
                )
            self._was_dead_step(action)
            return
        if not isinstance(action, str):
            raise TypeError(f"action for agent {agent!r} must be a str (the model's text), got {type(action).__name__}")

        self._cumulative_rewards[agent] = 0.0
        self.rewards = dict.fromkeys(self.agents, 0.0)
        seen = self.observe(agent)  # recorded with the call: what the agent saw when it acted
        turn = self._act(agent, action)
        penalty = 0.0 if turn.valid else self.format_penalty
        self.rewards[agent] -= penalty
        info = {**self._base_info(agent, valid=turn.valid), "penalty": penalty, **turn.info}
        self.infos[agent] = info
        self.history.append(
            CallRecord(
                agent_id=agent,
                turn=self.num_turns,
                agent_turn=sum(r.agent_id == agent for r in self.history),
                prompt=seen["prompt"],
                messages=tuple(seen["messages"]),
                text=action,
                valid=bool(turn.valid),
                penalty=float(penalty),
                info=info,
            )
        )
        self.num_turns += 1

        if turn.next_agent is None:
            outcome = self._episode_outcome()
            self._outcome, self._truncated = outcome, turn.truncated
            final = {"won": bool(outcome.won), "score": float(outcome.reward), **outcome.info}
            done = self.truncations if turn.truncated else self.terminations
            for a in self.agents:
                self.rewards[a] += outcome.reward_of(a)
                done[a] = True
                self.infos[a] = {**self.infos[a], **final}
        else:
            if turn.next_agent not in self.agents:
                raise RuntimeError(f"{type(self).__name__}._act returned unknown next agent {turn.next_agent!r}")
            self.agent_selection = turn.next_agent
        self._accumulate_rewards()
        for a, r in self.rewards.items():
            self.episode_returns[a] += r
        if turn.next_agent is None:
            self._deads_step_first()
        if self.render_mode == "human":
            self._print_new_lines()

    def render(self) -> str | None:
        """The transcript (task, then each call with its agent and validity).

        Returned with ``render_mode="ansi"``. With ``"human"`` the env already prints it while it steps; an explicit
        call prints only the lines not shown yet (nothing, right after a step).
        """
        if self.render_mode is None:
            gymnasium.logger.warn("render() called without render_mode; make the env with render_mode='ansi'")
            return None
        if self.render_mode == "human":
            self._print_new_lines()
            return None
        return self._transcript()

    def _print_new_lines(self) -> None:
        lines = self._transcript().split("\n")
        if len(lines) > self._shown:
            print("\n".join(lines[self._shown :]), flush=True)
        self._shown = len(lines)

    def _transcript(self) -> str:
        if not self._has_reset:
            return "(no episode: call reset() first)"
        lines = [f"# task {self.task.task_id} [{self.task.data_source}]", self.task.question, ""]
        for i, record in enumerate(self.history):
            flag = "" if record.valid else "  (invalid)"
            lines.append(f"--- turn {i} · {record.agent}{flag} ---")
            lines.append(record.text)
        if all(self.terminations.get(a, True) or self.truncations.get(a, False) for a in self.agents):
            lines.append(f"=== episode over; returns: {self.episode_returns} ===")
        return "\n".join(lines)

    def episode_record(self) -> EpisodeRecord:
        """The finished episode: task, calls in order (each with its score ``R_agent - penalty``) and outcome.

        Returns:
            a new :class:`~drmas_envs.core.episode.EpisodeRecord` (``traj_uid`` None: the player sets it).

        Raises:
            RuntimeError: before :meth:`reset`, or while the episode is still running.
        """
        if not self._has_reset or self._outcome is None:
            raise RuntimeError(
                f"{type(self).__name__}.episode_record() needs a finished episode; play it until every agent is done"
            )
        outcome = self._outcome
        return EpisodeRecord(
            task=self.task,
            agents=tuple(self.possible_agents),
            calls=tuple(dataclasses.replace(c, score=outcome.reward_of(c.agent_id) - c.penalty) for c in self.history),
            reward=float(outcome.reward),
            won=bool(self._outcome.won),
            metrics=dict(self._outcome.info),
            truncated=self._truncated,
            returns={a: float(r) for a, r in self.episode_returns.items()},
            agent_rewards={} if outcome.rewards is None else {a: float(r) for a, r in outcome.rewards.items()},
        )

    def close(self) -> None:
        """Release resources; safe to call any number of times."""
        self._closed = True

    # ---- helpers for subclasses ----
    def _base_info(self, agent: str, *, valid: bool) -> dict[str, Any]:
        return {
            "role": self.role(agent),
            "turn": self.num_turns,
            "task_id": self.task.task_id,
            "data_source": self.task.data_source,
            "is_action_valid": valid,
        }

    def calls_of(self, agent: str) -> list[CallRecord]:
        """All calls ``agent`` made this episode, in order."""
        return [r for r in self.history if r.agent == agent]
