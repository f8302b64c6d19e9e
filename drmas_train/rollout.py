"""The batched multi-agent rollout engine: N tasks x G rollouts of any drmas env, in lock-step.

At every step the engine collects the pending call of every live env (PettingZoo AEC: the env's
``agent_selection``), groups the calls by model (:meth:`ModelPool.model_of`) and makes **one batched generate
call per model**; each response text is fed back as that env's action. Envs finish at different times; a
finished env simply stops contributing calls. Output: one :class:`~drmas_train.samples.Sample` per agent call
and one :class:`TrajectoryRecord` per episode.

Grouping ids (the GRPO contract): the G rollouts of one task share ``uid``; different tasks of the batch —
even two copies of the same task — get different ``uid``; ``traj_uid`` = ``f"{uid}/{g}"`` names one episode.

Rewards: ``sample.reward = score - penalty`` where ``score`` is the episode reward (``infos["score"]`` at the
end) and ``penalty`` that call's format penalty (``infos["penalty"]``), the Dr. MAS reference convention.
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from drmas_train.assignment import ModelPool
from drmas_train.backends.base import TRUNCATION_MODES, Generation, SamplingParams, reports_tokens
from drmas_train.sample_io import load_samples, save_samples
from drmas_train.samples import Sample

__all__ = ["rollout", "RolloutResult", "TrajectoryRecord", "save_samples", "load_samples"]


@dataclasses.dataclass
class TrajectoryRecord:
    """One finished episode.

    Attributes:
        traj_uid, uid: ids as in :class:`Sample`.
        task_id, data_source: the task's tags.
        won, score: the env's outcome (``score`` = episode reward before penalties).
        episode_returns: ``agent_id -> return`` (score minus that agent's penalties).
        num_turns: calls made in the episode (all agents).
        calls: ``agent_id -> number of calls``; invalid_calls: ``agent_id -> number of invalid calls``.
        truncated: the episode ended by a step limit rather than terminating.
        wall_time_s: seconds from the batch start to this episode's end.
    """

    traj_uid: str
    uid: str
    task_id: str
    data_source: str
    won: bool
    score: float
    episode_returns: dict[str, float]
    num_turns: int
    calls: dict[str, int]
    invalid_calls: dict[str, int]
    truncated: bool
    wall_time_s: float


@dataclasses.dataclass
class RolloutResult:
    """Samples (one per agent call, in call order per trajectory), trajectories and timing.

    ``timing`` holds seconds: ``total``, ``generate`` (inside backend calls), ``env`` (env reset/step/observe),
    and counts: ``generate_calls`` (batched backend calls), ``steps`` (lock-step iterations).
    """

    samples: list[Sample]
    trajectories: list[TrajectoryRecord]
    timing: dict[str, float]


@dataclasses.dataclass
class _Slot:
    env: Any
    uid: str
    traj_uid: str
    pending: list[dict[str, Any]]  # this episode's calls, finalised at its end
    agent_turns: dict[str, int]
    done: bool = False


def _group_uids(n_tasks: int, seed: int) -> list[str]:
    """Distinct, seed-reproducible group ids, one per task position."""
    rng = random.Random(f"drmas-uid-{seed}")
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n_tasks)]


def _advance(slot: _Slot) -> None:
    """Play dead steps (``step(None)``) until a live agent must act or the episode is over."""
    env = slot.env
    while env.agents:
        agent = env.agent_selection
        if env.terminations.get(agent) or env.truncations.get(agent):
            env.step(None)
        else:
            return
    slot.done = True


def rollout(
    env_fn: Callable[[], Any] | str,
    tasks: Sequence[Any],
    group_size: int,
    pool: ModelPool,
    sampling: SamplingParams,
    *,
    seed: int,
    max_prompt_tokens: int | None = None,
    truncation: str = "left",
    progress: bool = True,
) -> RolloutResult:
    """Play ``len(tasks) x group_size`` episodes in lock-step with one batched generate call per model per step.

    Args:
        env_fn: zero-argument factory of a fresh drmas env, or a registered env id (``drmas_envs.make``).
        tasks: N tasks, as :class:`~drmas_envs.core.Task` objects or indices into the env's own task source.
        group_size: G rollouts per task (>= 1).
        pool: the models and backends (:func:`~drmas_train.assignment.build_models`); validated against the
            env's ``possible_agents`` first.
        sampling: per-call sampling parameters; ``n`` must be 1 (the G rollouts are separate episodes).
            Each batched call gets a seed drawn from ``sampling.seed`` (or ``seed``), so a rollout is
            reproducible for a fixed seed, pool and task list.
        seed: seeds env resets, sampling and the group ids.
        max_prompt_tokens: prompt length limit in tokens, or None; ``truncation`` (``"left"``, ``"middle"``,
            ``"error"``) says how longer prompts are cut (:func:`~drmas_train.backends.base.truncate_ids`).
            Response length is ``sampling.max_new_tokens``.
        progress: show a tqdm bar of finished trajectories / total, and one of generated tokens that moves during
            each batched call (backends that report tokens as they decode, :func:`~drmas_train.backends.base.reports_tokens`).

    Returns:
        :class:`RolloutResult` (samples ordered by trajectory, then turn).

    Raises:
        ValueError: ``group_size < 1``, no tasks, ``sampling.n != 1`` or an unknown truncation mode.
        AssignmentError: an env agent without a model, or an assigned agent the env does not have.
    """
    from tqdm.auto import tqdm

    if isinstance(env_fn, str):
        import drmas_envs

        env_id = env_fn
        env_fn = lambda: drmas_envs.make(env_id)  # noqa: E731
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if len(tasks) == 0:
        raise ValueError("tasks is empty: give at least one Task or task index")
    if sampling.n != 1:
        raise ValueError(
            f"sampling.n must be 1 in rollout (use group_size for G rollouts per task), got {sampling.n}"
        )
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")

    start = time.perf_counter()
    timing = {"generate": 0.0, "env": 0.0, "generate_calls": 0, "steps": 0}
    uids = _group_uids(len(tasks), seed)
    seeds = random.Random(f"drmas-rollout-{sampling.seed if sampling.seed is not None else seed}")

    t_env = time.perf_counter()
    slots: list[_Slot] = []
    for i, task in enumerate(tasks):
        options = (
            {"task_index": task} if isinstance(task, int) and not isinstance(task, bool) else {"task": task}
        )
        for g in range(group_size):
            env = env_fn()
            if not slots:
                pool.validate(env.possible_agents, _env_name(env))
            env.reset(seed=seeds.getrandbits(31), options=options)
            slot = _Slot(env, uids[i], f"{uids[i]}/{g}", [], defaultdict(int))
            _advance(slot)
            slots.append(slot)
    timing["env"] += time.perf_counter() - t_env

    samples: list[Sample] = []
    trajectories: list[TrajectoryRecord] = []
    bar = tqdm(total=len(slots), desc="rollout", unit="traj", disable=not progress, leave=False)
    # tokens as they are decoded: the trajectory bar cannot move during a lock-step call that lasts minutes
    streams = {m: reports_tokens(b) for m, b in pool.backends.items()}
    token_bar = tqdm(desc="generate", unit="tok", leave=False) if progress and any(streams.values()) else None
    try:
        for slot in slots:
            if slot.done:  # an episode that ended at reset (no call at all)
                _finish(slot, samples, trajectories, start)
                bar.update(1)
        while True:
            live = [s for s in slots if not s.done]
            if not live:
                break
            timing["steps"] += 1
            t_env = time.perf_counter()
            by_model: dict[str, list[tuple[_Slot, str, dict[str, Any]]]] = defaultdict(list)
            for slot in live:
                agent = slot.env.agent_selection
                by_model[pool.model_of(agent)].append((slot, agent, slot.env.observe(agent)))
            timing["env"] += time.perf_counter() - t_env

            for model_id, calls in by_model.items():
                backend = pool.backends[model_id]
                kwargs = {}
                if max_prompt_tokens is not None:
                    kwargs = {"max_prompt_tokens": max_prompt_tokens, "truncation": truncation}
                if token_bar is not None and streams[model_id]:
                    kwargs["on_tokens"] = lambda rows, tokens: token_bar.update(len(tokens))
                t_gen = time.perf_counter()
                gens: list[Generation] = backend.generate(
                    [list(obs["messages"]) for _, _, obs in calls],
                    sampling.replace(seed=seeds.getrandbits(63)),
                    **kwargs,
                )
                timing["generate"] += time.perf_counter() - t_gen
                timing["generate_calls"] += 1

                t_env = time.perf_counter()
                for (slot, agent, obs), gen in zip(calls, gens, strict=True):
                    env = slot.env
                    turn = len(slot.pending)  # calls so far in this episode, all agents
                    env.step(gen.text)
                    info = env.infos.get(agent, {})
                    slot.pending.append(
                        {
                            "agent_id": agent,
                            "model_id": model_id,
                            "turn": turn,
                            "agent_turn": slot.agent_turns[agent],
                            "gen": gen,
                            "prompt": obs.get("prompt", ""),
                            "valid": bool(info.get("is_action_valid", True)),
                            "penalty": float(info.get("penalty", 0.0)),
                            "tokenizer": getattr(backend, "tokenizer", None),
                        }
                    )
                    slot.agent_turns[agent] += 1
                    if not _episode_over(env):
                        _advance(slot)  # dead steps of agents that left early, if any
                    if slot.done or _episode_over(env):
                        _finish(slot, samples, trajectories, start)
                        bar.update(1)
                timing["env"] += time.perf_counter() - t_env
    finally:
        bar.close()
        if token_bar is not None:
            token_bar.close()
    timing["total"] = time.perf_counter() - start
    order = {s.traj_uid: k for k, s in enumerate(slots)}
    samples.sort(key=lambda s: (order[s.traj_uid], s.turn))
    trajectories.sort(key=lambda t: order[t.traj_uid])
    return RolloutResult(samples, trajectories, timing)


def _env_name(env: Any) -> str:
    """The env's ``metadata["name"]`` (PettingZoo convention), else its class name."""
    raw = getattr(env, "unwrapped", env)
    return str(getattr(raw, "metadata", {}).get("name") or type(raw).__name__)


def _episode_over(env: Any) -> bool:
    """True once every agent still listed is terminated or truncated (the base ends all agents together)."""
    return all(env.terminations.get(a) or env.truncations.get(a) for a in env.agents)


def _final_info(env: Any) -> dict[str, Any]:
    for agent in env.possible_agents:
        info = env.infos.get(agent, {})
        if "score" in info:
            return info
    return {}


def _finish(slot: _Slot, samples: list[Sample], trajectories: list[TrajectoryRecord], start: float) -> None:
    """Turn the episode's pending calls into Samples (reward = score - penalty) and record the trajectory."""
    env = slot.env
    raw = getattr(env, "unwrapped", env)
    final = _final_info(env)
    score = float(final.get("score", 0.0))
    won = bool(final.get("won", False))
    task = raw.task
    calls: dict[str, int] = defaultdict(int)
    invalid: dict[str, int] = defaultdict(int)
    for call in slot.pending:
        gen: Generation = call["gen"]
        calls[call["agent_id"]] += 1
        invalid[call["agent_id"]] += 0 if call["valid"] else 1
        tokenizer = call["tokenizer"]
        prompt_text = (
            tokenizer.decode(gen.prompt_ids) if tokenizer is not None and gen.prompt_ids else call["prompt"]
        )
        samples.append(
            Sample(
                uid=slot.uid,
                traj_uid=slot.traj_uid,
                agent_id=call["agent_id"],
                model_id=call["model_id"],
                turn=call["turn"],
                agent_turn=call["agent_turn"],
                prompt_ids=list(gen.prompt_ids),
                response_ids=list(gen.response_ids),
                old_logprobs=list(gen.logprobs),
                response_mask=[1] * len(gen.response_ids),
                prompt_text=prompt_text,
                response_text=gen.text,
                is_action_valid=call["valid"],
                reward=score - call["penalty"],
                won=won,
                score=score,
                data_source=task.data_source,
                task_id=task.task_id,
                finish_reason=gen.finish_reason,
            )
        )
    trajectories.append(
        TrajectoryRecord(
            traj_uid=slot.traj_uid,
            uid=slot.uid,
            task_id=task.task_id,
            data_source=task.data_source,
            won=won,
            score=score,
            episode_returns={a: float(r) for a, r in getattr(raw, "episode_returns", {}).items()},
            num_turns=int(getattr(raw, "num_turns", len(slot.pending))),
            calls=dict(calls),
            invalid_calls={a: invalid.get(a, 0) for a in calls},
            truncated=any(env.truncations.get(a) for a in env.agents),
            wall_time_s=time.perf_counter() - start,
        )
    )
    slot.done = True
