"""π_old for the PPO ratio: recompute the old log-probabilities with the training model, and measure the drift.

Shape legend: **B** samples (agent calls) of one model, **T** response tokens.

The rollout engine (vLLM, the HF KV-cache decoder, a served model) returns a log-probability for every token it
sampled. The training forward pass computes the same quantity with other kernels, another batch layout and, for
vLLM, often another precision, so the two differ by a small "engine/trainer mismatch". If the PPO ratio
``exp(log π_θ - log π_old)`` uses the engine's numbers, the first mini-batch's ratio is not 1 and the clip and
grad norm also measure that numerical drift, not only the policy change. The Dr. MAS reference (like verl) therefore
recomputes ``old_log_probs`` with the actor before the update and only logs the difference to the engine's
(``langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1265-1298``: ``compute_log_prob`` per worker group, then
``training/<wg>/rollout_probs_diff_{max,mean,std}`` = |p_rollout - p_actor| over response tokens).

:func:`recompute_old_logprobs` does the same for one model: a no-grad forward (:func:`drmas_train.model.logprobs.forward_logprobs`)
over the samples, laid out in the micro-batches the update will use (:func:`drmas_train.algorithm.update.plan_micro_batches`
with the same settings), so with one mini-batch the first step's ratio is exactly 1 for every token. It returns new
:class:`~drmas_train.collect.samples.Sample` objects (the inputs are not changed) and the mismatch metrics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.logprob_drift import agent_logprob_gaps, logprob_mismatch
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import (
    advantage_rows,
    micro_batch_budget,
    plan_micro_batches,
    reuses_update_forward,
    shares_prompts,
)
from drmas_train.collect.samples import Sample
from drmas_train.model.logprobs import Forward, forward_logprobs
from drmas_train.model.precision import forward_dtype

__all__ = ["recompute_old_logprobs", "logprob_mismatch", "agent_logprob_gaps"]


@torch.no_grad()
def recompute_old_logprobs(
    model: Any,
    samples: Sequence[Sample],
    settings: UpdateSettings,
    *,
    pad_token_id: int,
    select: Sequence[bool] | np.ndarray | None = None,
    agree_budget: Callable[[int], int] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """The samples with ``old_logprobs`` taken from ``model``, and the engine/trainer mismatch.

    Args:
        model: the trainable causal LM whose update follows (its train/eval mode is restored afterwards), or a
            :class:`~drmas_train.model.logprobs.Forward` over a wrapped one.
        samples: (B,) this model's samples, ``old_logprobs`` as the rollout engine returned them.
        settings: the update's settings: the same temperature, micro-batch budget and forward path (LM-head chunk,
            shared prompts, autocast) give the same micro-batches, hence bitwise the same log-probs as the update's
            first forward, so with one mini-batch the first step's PPO ratio is exactly 1. With
            ``micro_batch_tokens="auto"`` the budget is chosen by the update's own resolver
            (:func:`~drmas_train.algorithm.update.micro_batch_budget`, from the free memory, which may differ by then).
        pad_token_id: tokenizer pad id.
        select: (B,) bools; only selected samples are recomputed (the trainer leaves out samples the loss
            ignores: advantage exactly 0 with no KL and no entropy term). None = all.
        agree_budget: makes an ``"auto"`` budget the same in every process training the model together
            (:attr:`drmas_train.algorithm.update.UpdateHooks.agree_budget`).

    Returns:
        ``(new_samples, metrics)``: B samples (copies for recomputed ones, whose ``rollout_logprobs`` keep the
        engine's log-probs, π_behav of the decoupled objective; the same objects otherwise) and
        :func:`logprob_mismatch` over the recomputed ones, with the per-agent gaps (:func:`agent_logprob_gaps`).

    Raises:
        ValueError: ``select`` not of length B.
    """
    chosen = list(range(len(samples))) if select is None else [i for i, keep in enumerate(select) if keep]
    if select is not None and len(select) != len(samples):
        raise ValueError(f"select has {len(select)} entries for {len(samples)} samples")
    if not chosen:
        return list(samples), {}
    forward = Forward.of(model)
    module = forward.module
    picked = [samples[i] for i in chosen]
    share = shares_prompts(module, settings)
    budget = micro_batch_budget(module, picked, settings, agree=agree_budget, lm_head_chunk=settings.lm_head_chunk)
    micros = plan_micro_batches(picked, budget, share=share, by_agent=settings.agent_grad_norms)
    new_rows: dict[int, list[float]] = {}
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    autocast_dtype = forward_dtype(settings.autocast, module)
    try:
        for micro in micros:
            batch = [picked[i] for i in micro]
            with torch.no_grad(), torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logprobs, _, _ = forward_logprobs(
                    forward, [s.prompt_ids for s in batch], [s.response_ids for s in batch], pad_token_id=pad_token_id,
                    temperature=settings.temperature, lm_head_chunk=settings.lm_head_chunk, share_prompts=share,
                )  # (b, T) float32, 0 on padding  # fmt: skip
            rows = logprobs.cpu().tolist()
            for j, i in enumerate(micro):
                new_rows[chosen[i]] = rows[j][: len(picked[i].response_ids)]
    finally:
        module.train(was_training)
    out = list(samples)
    for i, row in new_rows.items():
        out[i] = dataclasses.replace(samples[i], old_logprobs=row, rollout_logprobs=list(samples[i].behaviour_logprobs))
    metrics = logprob_mismatch(
        [samples[i].old_logprobs for i in chosen], [new_rows[i] for i in chosen], [samples[i].response_mask for i in chosen]
    )
    metrics.update(agent_logprob_gaps([samples[i] for i in chosen], [new_rows[i] for i in chosen]))
    return out, metrics


def old_logprobs_for_update(
    model: Any,
    samples: Sequence[Sample],
    advantages: np.ndarray,
    settings: UpdateSettings,
    *,
    pad_token_id: int,
    agree_budget: Callable[[int], int] | None = None,
    world_size: int,
) -> tuple[list[Sample], dict[str, float]]:
    """π_old of one model's samples just before its PPO update: recomputed with ``model`` when
    ``settings.recompute_old_logprobs`` (``algorithm.recompute_old_logprobs``, the reference's default), else the
    rollout engine's, unchanged. A strictly on-policy update (:func:`~drmas_train.algorithm.update.reuses_update_forward`
    with ``world_size`` processes) takes π_old from its own forward instead: the samples come back unchanged with no
    metrics, and the caller passes ``old_from_forward=True`` to :func:`~drmas_train.algorithm.update.ppo_update`.

    Only samples the loss reads are recomputed: a sample with advantage exactly 0 contributes nothing unless the
    KL or entropy term is on. Both the single-process updater and every Ray training rank call this (on a rank,
    ``model`` is a :class:`~drmas_train.model.logprobs.Forward` over its wrapped module and every rank recomputes the
    same samples, so the collectives of the forward passes line up).

    Args:
        model: the training model (its current weights are π_old), or a Forward over it. samples: (B,).
        advantages: (B,) or (B, T) float. settings: the update's settings. pad_token_id: the tokenizer's pad id.
        agree_budget: see :func:`recompute_old_logprobs`. world_size: the processes training the model together
            (required: on several ranks π_old is always a separate recompute).

    Returns:
        ``(samples, metrics)``: the samples to update on and the engine/trainer mismatch metrics
        (:func:`logprob_mismatch`, with ``old_logprob_reused`` = 0: a separate forward ran; empty when none ran).
    """
    if not settings.recompute_old_logprobs or reuses_update_forward(settings, world_size):
        return list(samples), {}
    loss = settings.loss
    used = advantage_rows(advantages) | bool(loss.kl_coef) | bool(loss.entropy_coef)  # what the loss reads
    samples, metrics = recompute_old_logprobs(model, samples, settings, pad_token_id=pad_token_id, select=used,
                                              agree_budget=agree_budget)  # fmt: skip
    return samples, {**metrics, "old_logprob_reused": 0.0} if metrics else metrics
