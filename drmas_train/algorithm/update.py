"""The PPO update of one model on its samples: epochs x mini-batches x token-budget micro-batches.

Shape legend: **B** samples (agent calls) of this model, **T** response tokens.

A model shared by several agents receives all of their samples here, each with the advantage its estimator
gave it (advantages are computed once on the whole batch, before any split, so micro-batching can never change
them). Gradients of the micro-batches of one mini-batch are accumulated with the mini-batch's own denominator
(:func:`drmas_train.algorithm.losses.aggregate`), so the step equals the full mini-batch step up to float rounding.

The forward is the lean one of :func:`drmas_train.model.logprobs.forward_logprobs` (docs/update-performance.md): the
LM head in chunks over response tokens only, each group's shared prompt computed once (micro-batches keep a
prompt's rows together: :func:`drmas_train.algorithm.optim.prompt_micro_batches`), the entropy without autograd unless the
loss has an entropy term, optional bf16 autocast, and a micro-batch token budget that can be chosen from the free
memory (``micro_batch_tokens="auto"``, :mod:`drmas_train.algorithm.memory_budget`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.losses import PolicyLossConfig, policy_loss
from drmas_train.algorithm.optim import ModelOptimizer, micro_batches, prompt_micro_batches
from drmas_train.collect.samples import Sample
from drmas_train.model.logprobs import can_share_prompts, forward_logprobs

__all__ = ["ppo_update", "pad_right", "RankShare", "shares_prompts", "plan_micro_batches"]


def shares_prompts(model: Any, *, lm_head_chunk: int | None, share_prompts: bool, activation_checkpointing: int) -> bool:
    """Whether the update's forward really shares prompts: asked for, no activation checkpointing (checkpointed
    layers drop the KV cache) and a model whose cache can be shared (:func:`~drmas_train.model.logprobs.can_share_prompts`).
    Micro-batches count a shared prompt once only where this holds."""
    return share_prompts and not activation_checkpointing and can_share_prompts(model, lm_head_chunk)


def plan_micro_batches(samples: Sequence[Sample], token_budget: int, *, share: bool) -> list[list[int]]:
    """The update's micro-batches of ``samples`` (indices): prompt-grouped (a shared prompt counted once,
    :func:`~drmas_train.algorithm.optim.prompt_micro_batches`) when ``share``, else by padded length
    (:func:`~drmas_train.algorithm.optim.micro_batches`). The π_old recompute plans with it too, so its forwards
    are the update's first forwards."""
    if share:
        return prompt_micro_batches([s.prompt_ids for s in samples], [len(s.response_ids) for s in samples], token_budget)
    return micro_batches([len(s.prompt_ids) + len(s.response_ids) for s in samples], token_budget)


@dataclasses.dataclass(frozen=True)
class RankShare:
    """One data-parallel rank's share of :func:`ppo_update` (built by
    :func:`drmas_train.distributed.data_parallel.dp_ppo_update`; ``None`` = the single-process update).

    Every rank plans the same micro-batches; rank ``r`` of ``world_size`` runs micro-batches ``r, r + N, ...`` with
    the loss scaled by ``N / denom`` (the averaged gradient then equals the single-process sum over ``denom``), and
    ranks with fewer micro-batches run zero-loss ``idle_step`` passes so every rank joins every collective.

    Attributes:
        rank, world_size: this rank and the group size.
        sync: ``sync(last) -> context manager`` for one forward/backward pass; gradients are reduced across ranks
            only on the mini-batch's last pass (DDP ``no_sync`` / FSDP2 ``set_requires_gradient_sync``).
        idle_step: a forward/backward with zero loss (joins the pass's collectives, adds nothing to gradients).
        reduce: ``reduce(sums, weight) -> (sums, weight)`` summed over ranks (identical on every rank).
        agree_budget: ``agree_budget(tokens) -> tokens`` the same on every rank (the minimum), for ``"auto"``.
    """

    rank: int
    world_size: int
    sync: Callable[[bool], Any]
    idle_step: Callable[[], None]
    reduce: Callable[[dict[str, float], float], tuple[dict[str, float], float]]
    agree_budget: Callable[[int], int]

#: loss metrics aggregated with the mini-batch denominator (summed over micro-batches, then averaged over
#: mini-batches); the others are per-micro-batch token means (token-weighted).
_ADDITIVE = frozenset({"pg_loss"})


def pad_right(rows: Sequence[Sequence[float]], length: int, value: float = 0.0) -> torch.Tensor:
    """(B, length) float32 tensor of ``rows`` right-padded with ``value`` (rows longer than ``length`` are cut)."""
    out = torch.full((len(rows), length), value, dtype=torch.float32)
    for b, row in enumerate(rows):
        n = min(len(row), length)
        if n:
            out[b, :n] = torch.as_tensor(list(row[:n]), dtype=torch.float32)
    return out


def _denominator(samples: Sequence[Sample], agg: str) -> float:
    if agg == "token-mean":
        return float(max(sum(sum(s.response_mask) for s in samples), 1))
    return float(max(len(samples), 1))


def ppo_update(
    model: Any,
    opt: ModelOptimizer,
    samples: Sequence[Sample],
    advantages: np.ndarray,
    *,
    loss_cfg: PolicyLossConfig,
    pad_token_id: int,
    temperature: float,
    ppo_epochs: int = 1,
    mini_batches: int = 1,
    micro_batch_tokens: int | str = 8192,
    ref_model: Any = None,
    seed: int = 0,
    skip_zero_advantage: bool = True,
    lm_head_chunk: int | None = None,
    share_prompts: bool = True,
    autocast_dtype: torch.dtype | None = None,
    activation_checkpointing: int = 0,
    share: RankShare | None = None,
) -> dict[str, float]:
    """Run the PPO epochs of one model and return its metrics.

    Args:
        model: the trainable causal LM (mode set to train for the update, restored to eval after).
        opt: its :class:`ModelOptimizer`.
        samples: (B,) the model's samples this iteration (any agents).
        advantages: (B,) float advantages aligned with ``samples``.
        loss_cfg: PPO loss settings.
        pad_token_id: tokenizer pad id. temperature: the rollout temperature (log-probs are taken at it).
        ppo_epochs, mini_batches: passes over the data and optimizer steps per pass.
        micro_batch_tokens: token budget per forward/backward (padding included; with ``share_prompts`` a shared
            prompt counts once), or ``"auto"``: chosen from the free memory once per call
            (:func:`drmas_train.algorithm.memory_budget.auto_micro_batch_tokens`).
        ref_model: frozen reference for the KL penalty (needed when ``loss_cfg.kl_coef`` != 0).
        seed: seeds the mini-batch shuffle (numpy Generator; deterministic given the iteration).
        skip_zero_advantage: with no KL and no entropy term, a sample whose advantage is exactly 0 contributes
            exactly 0 to the loss and its gradient, so its forward/backward is skipped (it still counts in the
            mini-batch denominator, and the optimizer still steps on zero gradients, so the update is identical).
            Its tokens then do not enter the diagnostics (entropy, clip fractions). On a weak model where most
            groups have equal rewards this saves most of the update time.
        lm_head_chunk: tokens per LM-head chunk (None = automatic, 0 = the plain full-logits path), see
            :func:`drmas_train.model.logprobs.forward_logprobs`.
        share_prompts: compute each distinct prompt of a micro-batch once (same loss and gradients up to float
            rounding; tests/train/test_update_fast.py).
        autocast_dtype: run forwards under ``torch.autocast`` in this dtype (``torch.bfloat16``; None = off). See
            :func:`drmas_train.algorithm.precision.resolve_autocast` for where it pays off and its log-prob error.
        activation_checkpointing: 0 = off; k >= 1 = recompute every k-th decoder layer in the backward instead of
            keeping its activations (transformers' ``activation_checkpointing_enable(every_n_layers=k)``, switched
            on for this call only): about 1.3 MB -> 0.1 MB of saved activations per token for SmolLM2 at k = 1,
            for about a third more forward compute. Shared prompts need the KV cache, which checkpointed layers
            drop, so they are not shared while it is on.

    Returns:
        ``grad_norm`` (mean pre-clip norm over steps) and ``grad_norm_max``, ``steps``, ``skipped_steps`` (non-finite
        norms this call), ``lr``, ``micro_batch_tokens`` (the budget used), and the token-weighted means of the loss metrics (``pg_loss``, ``clipfrac_upper``,
        ``clipfrac_lower``, ``dual_clipfrac``, ``approx_kl``, ``ratio_mean``, ``entropy``, ``kl``).

    Raises:
        ValueError: ``advantages`` not aligned with ``samples``; ``micro_batch_tokens`` neither >= 1 nor "auto".
    """
    if len(advantages) != len(samples):
        raise ValueError(f"got {len(advantages)} advantages for {len(samples)} samples")
    if not (micro_batch_tokens == "auto" or (isinstance(micro_batch_tokens, int) and micro_batch_tokens >= 1)):
        raise ValueError(f"micro_batch_tokens must be an int >= 1 or 'auto', got {micro_batch_tokens!r}")
    if not samples:
        return {}
    if activation_checkpointing < 0:
        raise ValueError(f"activation_checkpointing must be >= 0 (0 = off, k = every k-th layer), got {activation_checkpointing}")
    # micro-batches count a shared prompt once only where the forward really shares it
    share_prompts = shares_prompts(model, lm_head_chunk=lm_head_chunk, share_prompts=share_prompts,
                                   activation_checkpointing=activation_checkpointing)  # fmt: skip
    fwd = {"lm_head_chunk": lm_head_chunk, "share_prompts": share_prompts}
    with _checkpointing(model, activation_checkpointing):
        return _ppo_update(model, opt, samples, advantages, loss_cfg, pad_token_id, temperature, ppo_epochs,
                           mini_batches, micro_batch_tokens, ref_model, seed, skip_zero_advantage, share_prompts, fwd,
                           autocast_dtype, share)  # fmt: skip


@contextlib.contextmanager
def _checkpointing(model: Any, every_n_layers: int):
    """Activation checkpointing of every ``every_n_layers``-th decoder layer inside the block (0 = leave as is)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not every_n_layers or getattr(base, "is_activation_checkpointing", False):
        yield
        return
    base.activation_checkpointing_enable({"use_reentrant": False}, every_n_layers=every_n_layers)
    try:
        yield
    finally:
        base.activation_checkpointing_disable()


def _ppo_update(model, opt, samples, advantages, loss_cfg, pad_token_id, temperature, ppo_epochs, mini_batches,
                micro_batch_tokens, ref_model, seed, skip_zero_advantage, share_prompts, fwd, autocast_dtype, share):  # fmt: skip
    if micro_batch_tokens == "auto":
        from drmas_train.algorithm.memory_budget import auto_micro_batch_tokens

        longest = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
        model.train()
        micro_batch_tokens = auto_micro_batch_tokens(model, longest, lm_head_chunk=fwd["lm_head_chunk"])
        if share is not None:  # every rank must plan the same micro-batches
            micro_batch_tokens = share.agree_budget(micro_batch_tokens)
    n = 1 if share is None else share.world_size
    rng = np.random.default_rng(seed)
    sums: dict[str, float] = defaultdict(float)
    weight = 0.0
    n_mb = 0
    norms: list[float] = []
    skipped = 0
    model.train()
    try:
        for _ in range(ppo_epochs):
            order = rng.permutation(len(samples)) if mini_batches > 1 else np.arange(len(samples))
            for mb in np.array_split(order, mini_batches):
                if len(mb) == 0:
                    continue
                denom = _denominator([samples[i] for i in mb], loss_cfg.agg)  # over the whole mini-batch
                if skip_zero_advantage and not loss_cfg.kl_coef and not loss_cfg.entropy_coef:
                    mb = mb[np.asarray(advantages)[mb] != 0]
                mb_samples = [samples[i] for i in mb]
                n_mb += 1
                micros = plan_micro_batches(mb_samples, micro_batch_tokens, share=share_prompts)
                mine = micros if share is None else micros[share.rank :: n]
                rounds = -(-len(micros) // n)  # passes per rank: every rank joins every collective
                for r in range(rounds):
                    with contextlib.nullcontext() if share is None else share.sync(r == rounds - 1):
                        if r >= len(mine):  # a data-parallel rank with fewer micro-batches
                            share.idle_step()
                            continue
                        micro = mine[r]
                        batch = [mb_samples[i] for i in micro]
                        adv = torch.as_tensor(advantages[mb[micro]], dtype=torch.float32)  # (b,)
                        metrics, tokens = _micro_step(
                            model, batch, adv, loss_cfg, pad_token_id, temperature, denom / n, ref_model, fwd,
                            autocast_dtype,
                        )  # fmt: skip
                    for k, v in metrics.items():
                        # aggregated with the mini-batch denominator: micro parts add up to the mini-batch value
                        sums[k] += v / n if k in _ADDITIVE else v * tokens
                    weight += tokens
                norm, stepped = opt.step()
                norms.append(norm)
                skipped += not stepped
    finally:
        model.eval()
    if share is not None:
        sums, weight = share.reduce(dict(sums), weight)
    out = {k: v / n_mb if k in _ADDITIVE else v / max(weight, 1.0) for k, v in sums.items()}
    finite = [x for x in norms if np.isfinite(x)]
    out.update(
        micro_batch_tokens=float(micro_batch_tokens),
        grad_norm=float(np.mean(finite)) if finite else float("nan"),
        grad_norm_max=float(np.max(finite)) if finite else float("nan"),
        steps=float(len(norms)),
        skipped_steps=float(skipped),
        lr=opt.lr,
    )
    return out


def _micro_step(model, batch, adv, loss_cfg, pad_token_id, temperature, denom, ref_model, fwd, autocast_dtype):
    """Forward + backward of one micro-batch; returns its metrics and real-token count."""
    prompts = [s.prompt_ids for s in batch]
    responses = [s.response_ids for s in batch]
    device = next(model.parameters()).device
    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logprobs, mask, entropy = forward_logprobs(
            model, prompts, responses, pad_token_id=pad_token_id, temperature=temperature, with_entropy=True,
            entropy_grad=bool(loss_cfg.entropy_coef), **fwd,
        )  # (b, T) each  # fmt: skip
        T = logprobs.shape[1]
        old = pad_right([s.old_logprobs for s in batch], T).to(logprobs.device)  # (b, T)
        mask = mask * pad_right([s.response_mask for s in batch], T).to(mask.device)  # (b, T): drop masked tokens
        ref = None
        if loss_cfg.kl_coef:
            with torch.no_grad():
                ref, _, _ = forward_logprobs(ref_model, prompts, responses, pad_token_id=pad_token_id,
                                             temperature=temperature, **fwd)  # fmt: skip
        loss, metrics = policy_loss(
            logprobs, old, adv.to(logprobs.device), mask, loss_cfg, entropy=entropy, ref_logprobs=ref, denom=denom
        )
    loss.backward()
    return metrics, float(mask.sum())
