"""Rollouts -> per-agent prompt/completion/reward datasets for single-agent LLM-RL trainers (TRL, ...).

Each agent call becomes one row in that agent's dataset. Rows use TRL's dataset formats
(https://huggingface.co/docs/trl/dataset_formats):

* standard (default): ``{"prompt": str, "completion": str, ...}``;
* conversational (``conversational=True``): ``{"prompt": [{"role", "content"}, ...],
  "completion": [{"role": "assistant", "content": str}], ...}``, the chat messages the agent saw.

and carry these extra columns (TRL passes extra columns to reward functions as keyword arguments):

=====================  ======  =================================================================
column                 type    meaning
=====================  ======  =================================================================
``reward``             float   the call's score: episode reward ``R`` minus this call's format penalty
``label``              bool    KTO's "desirable" flag: the episode was won and the call was valid
``agent_id``           str     the agent that made the call
``traj_uid``           str     id of the episode; calls of one episode share it
``task_id``            str     the task's id; ``data_source`` its benchmark tag
``turn``               int     index of the call in its episode (all agents); ``agent_turn`` among its agent's
``is_action_valid``    bool    the env's validity verdict
``won``, ``score``     bool,   the episode's outcome and reward ``R``
                       float
=====================  ======  =================================================================

Input: episodes played with :func:`record_episode` (any drmas text env and text policies), or
``drmas_train`` :class:`~drmas_train.samples.Sample` objects (duck-typed, via :func:`samples_to_rows`).
Output: ``{agent_id: [row, ...]}``; :func:`write_jsonl` writes one ``<agent_id>.jsonl`` per agent (load
with ``datasets.load_dataset("json", data_files=...)``) and :func:`to_hf_datasets` builds
``datasets.Dataset`` objects when the ``datasets`` package is installed.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pettingzoo import AECEnv

__all__ = [
    "CallRecord",
    "EpisodeRecord",
    "record_episode",
    "episodes_to_rows",
    "samples_to_rows",
    "write_jsonl",
    "to_hf_datasets",
]


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One agent call: what it saw (``prompt``, ``messages``), what it said, and the env's verdict."""

    agent_id: str
    turn: int
    agent_turn: int
    prompt: str
    messages: tuple[dict[str, str], ...]
    completion: str
    is_action_valid: bool
    penalty: float


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode: its calls in order and its outcome (``score`` = episode reward ``R``)."""

    traj_uid: str
    task_id: str
    data_source: str
    score: float
    won: bool
    calls: tuple[CallRecord, ...]


def record_episode(
    env: AECEnv,
    policies: Mapping[str, Callable[[Any], Any]],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    traj_uid: str | None = None,
    max_calls: int = 10_000,
) -> EpisodeRecord:
    """Play one episode of a drmas env with ``policies`` and record every call.

    ``env`` may be wrapped (DiscreteChoices, TokenSpaces, ...): policies get the wrapped observation and
    return the wrapped action, while the record holds what the text env saw and received: the prompt and
    messages of ``env.unwrapped.observe(agent)`` and the text of ``env.unwrapped.history[-1]``.

    Args:
        env: a drmas env (its ``unwrapped`` observations are ``{"prompt", "messages"}``), possibly wrapped.
        policies: agent id -> ``policy(observation) -> action`` for every agent that may act.
        seed, options: passed to ``env.reset``.
        traj_uid: id of the episode (default: a random uuid4 hex).
        max_calls: stop with an error after this many calls (guards against a non-terminating env).

    Raises:
        KeyError: an agent with no policy got the turn (the message names it).
        TypeError: the action that reached the text env is not a str (names the agent).
        RuntimeError: the episode did not end within ``max_calls`` calls, or ended without ``score``.
    """
    env.reset(seed=seed, options=options)
    base = env.unwrapped
    calls: list[CallRecord] = []
    per_agent: dict[str, int] = {}
    final: dict[str, Any] = {}
    while env.agents:
        agent = env.agent_selection
        if env.terminations[agent] or env.truncations[agent]:
            env.step(None)
            continue
        if len(calls) >= max_calls:
            raise RuntimeError(f"episode did not end within max_calls={max_calls} calls")
        if agent not in policies:
            raise KeyError(
                f"no policy for agent {agent!r}, whose turn it is; policies cover {sorted(policies)}"
            )
        text_obs = base.observe(agent)
        action = policies[agent](env.observe(agent))
        env.step(action)
        history = getattr(base, "history", None)
        completion = history[-1].text if history else action
        if not isinstance(completion, str):
            raise TypeError(f"the action of agent {agent!r} that reached the env is not text: {completion!r}")
        info = base.infos[agent]
        calls.append(
            CallRecord(
                agent_id=agent,
                turn=len(calls),
                agent_turn=per_agent.get(agent, 0),
                prompt=text_obs["prompt"],
                messages=tuple(dict(m) for m in text_obs["messages"]),
                completion=completion,
                is_action_valid=bool(info.get("is_action_valid", True)),
                penalty=float(info.get("penalty", 0.0)),
            )
        )
        per_agent[agent] = per_agent.get(agent, 0) + 1
        if "score" in info:
            final = dict(info)
    if "score" not in final:
        raise RuntimeError("the episode ended but no agent's infos carried 'score' (is this a drmas env?)")
    return EpisodeRecord(
        traj_uid=traj_uid or uuid.uuid4().hex,
        task_id=str(final.get("task_id", "")),
        data_source=str(final.get("data_source", "")),
        score=float(final["score"]),
        won=bool(final.get("won", False)),
        calls=tuple(calls),
    )


def _row(
    *,
    prompt: Any,
    completion: Any,
    reward: float,
    agent_id: str,
    traj_uid: str,
    task_id: str,
    data_source: str,
    turn: int,
    agent_turn: int,
    is_action_valid: bool,
    won: bool,
    score: float,
) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "completion": completion,
        "reward": float(reward),
        "label": bool(won and is_action_valid),
        "agent_id": agent_id,
        "traj_uid": traj_uid,
        "task_id": task_id,
        "data_source": data_source,
        "turn": int(turn),
        "agent_turn": int(agent_turn),
        "is_action_valid": bool(is_action_valid),
        "won": bool(won),
        "score": float(score),
    }


def episodes_to_rows(
    episodes: Iterable[EpisodeRecord], *, conversational: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Per-agent rows (see the module docstring) of recorded episodes, in episode then call order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for episode in episodes:
        for call in episode.calls:
            if conversational:
                prompt: Any = [dict(m) for m in call.messages]
                completion: Any = [{"role": "assistant", "content": call.completion}]
            else:
                prompt, completion = call.prompt, call.completion
            rows.setdefault(call.agent_id, []).append(
                _row(
                    prompt=prompt,
                    completion=completion,
                    reward=episode.score - call.penalty,
                    agent_id=call.agent_id,
                    traj_uid=episode.traj_uid,
                    task_id=episode.task_id,
                    data_source=episode.data_source,
                    turn=call.turn,
                    agent_turn=call.agent_turn,
                    is_action_valid=call.is_action_valid,
                    won=episode.won,
                    score=episode.score,
                )
            )
    return rows


def samples_to_rows(samples: Iterable[Any]) -> dict[str, list[dict[str, Any]]]:
    """Per-agent standard-format rows of ``drmas_train`` Samples (or any object with the same attributes).

    Uses ``prompt_text`` (chat template already applied), ``response_text`` and the sample's own
    ``reward``.

    Raises:
        AttributeError: an object lacks a Sample attribute (the message names it).
    """
    rows: dict[str, list[dict[str, Any]]] = {}
    for sample in samples:
        rows.setdefault(sample.agent_id, []).append(
            _row(
                prompt=sample.prompt_text,
                completion=sample.response_text,
                reward=sample.reward,
                agent_id=sample.agent_id,
                traj_uid=sample.traj_uid,
                task_id=sample.task_id,
                data_source=sample.data_source,
                turn=sample.turn,
                agent_turn=sample.agent_turn,
                is_action_valid=sample.is_action_valid,
                won=sample.won,
                score=sample.score,
            )
        )
    return rows


def write_jsonl(rows_by_agent: Mapping[str, list[dict[str, Any]]], directory: str | Path) -> dict[str, Path]:
    """Write ``<directory>/<agent_id>.jsonl`` (one JSON row per line, UTF-8); return the paths.

    Raises:
        ValueError: an agent id that is not a plain file name (contains ``/``, ``\\`` or is ``.``/``..``).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for agent, rows in rows_by_agent.items():
        if not agent or "/" in agent or "\\" in agent or agent in (".", ".."):
            raise ValueError(f"agent id {agent!r} cannot be used as a file name")
        path = directory / f"{agent}.jsonl"
        with path.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        paths[agent] = path
    return paths


def to_hf_datasets(rows_by_agent: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``{agent_id: datasets.Dataset}`` of the rows (needs the ``datasets`` package: ``pip install drmas[hf]``).

    Raises:
        ImportError: ``datasets`` is not installed.
    """
    try:
        import datasets
    except ImportError as err:
        raise ImportError("to_hf_datasets needs the 'datasets' package: pip install 'drmas[hf]'") from err
    return {agent: datasets.Dataset.from_list(list(rows)) for agent, rows in rows_by_agent.items()}
