"""The :class:`Sample` record: one agent call, the unit that rollout produces and the trainer consumes.

A Sample is one :class:`~drmas_envs.core.episode.CallRecord` of the env's episode record (agent, validity,
per-call score, outcome, task tags) joined with its generation (token ids, old log-probs, finish reason); the
rollout engine (:mod:`drmas_train.collect.rollout`) makes the join.

Shape legend (see docs/): **B** samples in a batch (one per agent call), **T** response tokens, **G** rollouts
per task (group size), **N** tasks per batch, **A** agents per episode.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

__all__ = ["Sample", "observation_key"]


def observation_key(observation: str) -> str:
    """The anchor-state key of an observation text: a 128-bit BLAKE2b hex digest (32 characters) of its UTF-8 bytes.

    Equal observations give equal keys, so calls of one prompt group that acted on the same state share it (GiGPO's
    anchor states, :func:`drmas_train.algorithm.advantages.gigpo`).
    """
    return hashlib.blake2b(observation.encode("utf-8"), digest_size=16).hexdigest()


@dataclasses.dataclass
class Sample:
    """One agent call inside one trajectory.

    Attributes:
        uid: prompt-group id, shared by the G rollouts of one task and distinct across tasks.
        traj_uid: trajectory id, shared by every call of one episode.
        agent_id: the env agent that made the call (e.g. ``"solver"``).
        model_id: the model (key of the agent→model assignment) that generated it.
        turn: index of this call in its episode (0-based, counting all agents' calls).
        agent_turn: index of this call among its agent's calls in the episode (0-based).
        prompt_ids: prompt token ids (list[int], length P), chat template applied.
        response_ids: response token ids (list[int], length T).
        old_logprobs: log-probability of each response token under π_old (list[float], length T, float32
            precision): the rollout engine's as generated; the training model's after
            :func:`drmas_train.algorithm.old_logprobs.recompute_old_logprobs` (which then keeps the engine's in
            ``rollout_logprobs``).
        response_mask: 1 for tokens that count in the loss, 0 for padding/truncation (list[int], length T).
        prompt_text, response_text: the decoded strings (``response_text`` is the env action).
        is_action_valid: whether the env judged the action valid.
        reward: this call's score: the episode reward minus this call's format penalty.
        won, score: per-trajectory outcome (``score`` = the episode reward this call's agent received before
            penalties, ``EpisodeRecord.reward_of(agent_id)``: the same for every agent except in games, where each
            seat gets its own return).
        data_source, task_id: the task's tags.
        finish_reason: ``"stop"`` or ``"length"``.
        extra: free-form, JSON-serialisable.
        anchor_key: the anchor state the call acted on (GiGPO): :func:`observation_key` of the env's observation
            text (``observe(agent)["prompt"]``, before the chat template and any truncation); ``""`` when unknown
            (samples written before drmas recorded it).
        rollout_logprobs: the rollout engine's log-probs (length T) once ``old_logprobs`` were replaced by the
            training model's recomputation; None while ``old_logprobs`` are still the engine's. Read them through
            :attr:`behaviour_logprobs` (π_behav of the decoupled objective, :mod:`drmas_train.algorithm.losses`).
        policy_version: how many optimizer updates the generating model (``model_id``) had received when it
            generated this call (its trainer's version counter, :mod:`drmas_train.run.policy_versions`); 0 for
            samples written before drmas recorded it.
    """

    uid: str
    traj_uid: str
    agent_id: str
    model_id: str
    turn: int
    agent_turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    response_mask: list[int]
    prompt_text: str = ""
    response_text: str = ""
    is_action_valid: bool = True
    reward: float = 0.0
    won: bool = False
    score: float = 0.0
    data_source: str = ""
    task_id: str = ""
    finish_reason: str = "stop"
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    anchor_key: str = ""
    rollout_logprobs: list[float] | None = None
    policy_version: int = 0

    @property
    def behaviour_logprobs(self) -> list[float]:
        """π_behav: the rollout engine's log-probs of the response tokens (``rollout_logprobs`` when π_old was
        recomputed, else ``old_logprobs``); may be shorter than the response when a backend did not return them."""
        return self.old_logprobs if self.rollout_logprobs is None else self.rollout_logprobs

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` is its exact inverse."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: naming missing or unknown fields.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(row) - names)
        if unknown:
            raise ValueError(f"unknown Sample field(s) {unknown}; known: {sorted(names)}")
        try:
            return cls(**row)
        except TypeError as err:
            raise ValueError(f"cannot build a Sample from row with keys {sorted(row)}: {err}") from err
