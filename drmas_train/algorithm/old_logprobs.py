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

from drmas_train.algorithm.agent_grads import AGENT_PREFIX
from drmas_train.algorithm.precision import resolve_autocast
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import advantage_rows, plan_micro_batches, shares_prompts
from drmas_train.collect.samples import Sample
from drmas_train.model.logprobs import Forward, forward_logprobs

__all__ = ["recompute_old_logprobs", "logprob_mismatch", "agent_logprob_gaps"]


def logprob_mismatch(
    engine: Sequence[Sequence[float]], recomputed: Sequence[Sequence[float]], masks: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Drift between the engine's and the trainer's log-probs of the same tokens, over tokens with mask 1.

    Args:
        engine: B rows of the rollout engine's per-token log-probs (nats; row b has T_b entries).
        recomputed: B rows of the training model's log-probs of the same tokens (same lengths).
        masks: B rows of response masks (1 = token counts in the loss).

    Returns:
        ``old_logprob_abs_diff_max`` / ``old_logprob_abs_diff_mean``: max and mean of ``|Δ log p|`` (nats);
        ``old_prob_abs_diff_max`` / ``_mean`` / ``_std`` (n - 1): the same for ``|Δ p|``, the reference's
        ``rollout_probs_diff_{max,mean,std}`` (langfengQ/DrMAS verl/trainer/ppo/ray_trainer.py:1290-1298);
        ``old_logprob_tokens``: how many tokens were compared. Empty dict when no token has mask 1.

    Raises:
        ValueError: rows of different counts or lengths.
    """
    if not len(engine) == len(recomputed) == len(masks):
        raise ValueError(f"got {len(engine)} engine rows, {len(recomputed)} recomputed rows and {len(masks)} masks")
    diffs_lp, diffs_p = [], []
    for b, (e, r, m) in enumerate(zip(engine, recomputed, masks, strict=True)):
        if not len(e) == len(r) == len(m):
            raise ValueError(f"row {b}: {len(e)} engine log-probs, {len(r)} recomputed, {len(m)} mask entries")
        keep = np.asarray(m, dtype=bool)
        e_np, r_np = np.asarray(e, dtype=np.float64)[keep], np.asarray(r, dtype=np.float64)[keep]
        diffs_lp.append(np.abs(e_np - r_np))
        diffs_p.append(np.abs(np.exp(e_np) - np.exp(r_np)))
    lp = np.concatenate(diffs_lp) if diffs_lp else np.zeros(0)
    if lp.size == 0:
        return {}
    p = np.concatenate(diffs_p)
    return {
        "old_logprob_abs_diff_max": float(lp.max()),
        "old_logprob_abs_diff_mean": float(lp.mean()),
        "old_prob_abs_diff_max": float(p.max()),
        "old_prob_abs_diff_mean": float(p.mean()),
        "old_prob_abs_diff_std": float(p.std(ddof=1)) if p.size > 1 else 0.0,  # torch.std: n - 1, as the reference
        "old_logprob_tokens": float(lp.size),
    }


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
            ``micro_batch_tokens="auto"`` the budget is chosen here as in the update (from the free memory, which
            may differ by then).
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
    budget = settings.micro_batch_tokens
    if budget == "auto":
        from drmas_train.algorithm.memory_budget import auto_micro_batch_tokens

        longest = max(len(s.prompt_ids) + len(s.response_ids) for s in picked)
        budget = auto_micro_batch_tokens(module, longest, lm_head_chunk=settings.lm_head_chunk)
        budget = agree_budget(budget) if agree_budget is not None else budget
    micros = plan_micro_batches(picked, budget, share=share, by_agent=settings.agent_grad_norms)
    new_rows: dict[int, list[float]] = {}
    was_training = module.training
    module.eval()
    device = next(module.parameters()).device
    autocast_dtype = resolve_autocast(settings.autocast, device)
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


def agent_logprob_gaps(samples: Sequence[Sample], recomputed: Sequence[Sequence[float]]) -> dict[str, float]:
    """The engine/trainer log-prob gap per agent: ``agent/<a>/logprob_gap_mean`` and ``agent/<a>/logprob_gap_max``,
    the mean and max of ``|log p_engine - log p_trainer|`` (nats) over the agent's tokens with mask 1
    (:func:`logprob_mismatch` of its samples). Agents without such tokens are left out.

    Args:
        samples: (B,) samples with the engine's ``old_logprobs``. recomputed: B rows of the trainer's log-probs.
    """
    out: dict[str, float] = {}
    for agent in sorted({s.agent_id for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.agent_id == agent]
        m = logprob_mismatch([samples[i].old_logprobs for i in rows], [recomputed[i] for i in rows],
                             [samples[i].response_mask for i in rows])  # fmt: skip
        if m:
            out[f"{AGENT_PREFIX}{agent}/logprob_gap_mean"] = m["old_logprob_abs_diff_mean"]
            out[f"{AGENT_PREFIX}{agent}/logprob_gap_max"] = m["old_logprob_abs_diff_max"]
    return out


def old_logprobs_for_update(
    model: Any,
    samples: Sequence[Sample],
    advantages: np.ndarray,
    settings: UpdateSettings,
    *,
    pad_token_id: int,
    agree_budget: Callable[[int], int] | None = None,
) -> tuple[list[Sample], dict[str, float]]:
    """π_old of one model's samples just before its PPO update: recomputed with ``model`` when
    ``settings.recompute_old_logprobs`` (``algorithm.recompute_old_logprobs``, the reference's default), else the
    rollout engine's, unchanged.

    Only samples the loss reads are recomputed: a sample with advantage exactly 0 contributes nothing unless the
    KL or entropy term is on. Both the single-process updater and every Ray training rank call this (on a rank,
    ``model`` is a :class:`~drmas_train.model.logprobs.Forward` over its wrapped module and every rank recomputes the
    same samples, so the collectives of the forward passes line up).

    Args:
        model: the training model (its current weights are π_old), or a Forward over it. samples: (B,).
        advantages: (B,) or (B, T) float. settings: the update's settings. pad_token_id: the tokenizer's pad id.
        agree_budget: see :func:`recompute_old_logprobs`.

    Returns:
        ``(samples, metrics)``: the samples to update on and the engine/trainer mismatch metrics
        (:func:`logprob_mismatch`; empty when not recomputed).
    """
    if not settings.recompute_old_logprobs:
        return list(samples), {}
    loss = settings.loss
    used = advantage_rows(advantages) | bool(loss.kl_coef) | bool(loss.entropy_coef)  # what the loss reads
    return recompute_old_logprobs(model, samples, settings, pad_token_id=pad_token_id, select=used,
                                  agree_budget=agree_budget)  # fmt: skip
