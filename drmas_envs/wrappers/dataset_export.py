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
``ground_truth``       list    the task's acceptable answers (``Task.answers``), so a reward function (e.g.
                       [str]   TRL GRPO's ``reward_funcs``) grades completions without the env
=====================  ======  =================================================================

Input: :class:`~drmas_envs.core.episode.EpisodeRecord` s (played with :func:`record_episode`, or the
``episode`` of a ``drmas_train`` trajectory): rows are a view of the record. Or ``drmas_train``
:class:`~drmas_train.collect.samples.Sample` objects (duck-typed, via :func:`samples_to_rows`; a Sample carries no
ground truth, so those rows have no ``ground_truth`` column).
Output: ``{agent_id: [row, ...]}``; :func:`write_jsonl` writes one ``<agent_id>.jsonl`` per agent (load
with ``datasets.load_dataset("json", data_files=...)``) and :func:`to_hf_datasets` builds
``datasets.Dataset`` objects when the ``datasets`` package is installed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pettingzoo import AECEnv

from drmas_envs.core.episode import EpisodeRecord, play_episode

__all__ = [
    "record_episode",
    "episodes_to_rows",
    "samples_to_rows",
    "write_jsonl",
    "to_hf_datasets",
]


def record_episode(
    env: AECEnv,
    policies: Mapping[str, Callable[[Any], Any]],
    *,
    seed: int | None = None,
    options: dict[str, Any] | None = None,
    traj_uid: str | None = None,
    max_calls: int = 10_000,
) -> EpisodeRecord:
    """Play one episode of a drmas env with ``policies`` and return its record (:func:`~drmas_envs.core.play_episode`).

    ``env`` may be wrapped (DiscreteChoices, TokenSpaces, ...): policies get the wrapped observation and
    return the wrapped action, while the record holds what the text env saw and received.

    Args:
        env: a drmas env, possibly wrapped.
        policies: agent id -> ``policy(observation) -> action`` for every agent that may act.
        seed, options: passed to ``env.reset``.
        traj_uid: id of the episode (default: a random uuid4 hex).
        max_calls: stop with an error after this many calls (guards against a non-terminating env).

    Raises:
        KeyError: an agent with no policy got the turn (the message names it).
        TypeError: the action that reached the text env is not a str (names the agent).
        RuntimeError: the episode did not end within ``max_calls`` calls.
    """
    episode = play_episode(env, policies, seed=seed, options=options, max_calls=max_calls)
    return episode.with_traj_uid(traj_uid or uuid.uuid4().hex)


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
    ground_truth: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    row = {
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
    if ground_truth is not None:
        row["ground_truth"] = list(ground_truth)
    return row


def episodes_to_rows(
    episodes: Iterable[EpisodeRecord], *, conversational: bool = False
) -> dict[str, list[dict[str, Any]]]:
    """Per-agent rows (see the module docstring) of recorded episodes, in episode then call order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for episode in episodes:
        for call in episode.calls:
            if conversational:
                prompt: Any = [dict(m) for m in call.messages]
                completion: Any = [{"role": "assistant", "content": call.text}]
            else:
                prompt, completion = call.prompt, call.text
            rows.setdefault(call.agent_id, []).append(
                _row(
                    prompt=prompt,
                    completion=completion,
                    reward=call.score if call.score is not None else episode.reward - call.penalty,
                    agent_id=call.agent_id,
                    traj_uid=episode.traj_uid or "",
                    task_id=episode.task_id,
                    data_source=episode.data_source,
                    turn=call.turn,
                    agent_turn=call.agent_turn,
                    is_action_valid=call.valid,
                    won=episode.won,
                    score=episode.reward,
                    ground_truth=episode.ground_truth,
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
