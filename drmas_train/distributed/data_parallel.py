"""Data-parallel training of one model across the ranks of a ``torch.distributed`` process group.

Shape legend: **B** samples (agent calls) of this model, **T** response tokens.

:func:`wrap_model` shards the model with FSDP2 (``torch.distributed.fsdp.fully_shard``: each decoder layer, then
the root) or wraps it in DDP. FSDP2 runs on CUDA/NCCL and on CPU/gloo (checked with torch 2.13), so ``auto``
is FSDP2 everywhere; ``ddp`` keeps a full replica per rank.

:func:`dp_ppo_update` is :func:`drmas_train.algorithm.update.ppo_update` spread over ranks: every rank holds the whole
batch (token ids are small), draws the same mini-batch permutation, cuts each mini-batch into the same
token-budget micro-batches and runs micro-batch ``k`` on rank ``k mod world``. The loss of a micro-batch is
divided by ``denom / world`` (``denom`` = the whole mini-batch's, as in the single-process update) because both
FSDP2's reduce-scatter and DDP's all-reduce *average* gradients over ranks: the synchronised gradient is then
the sum over all micro-batches, i.e. the single-process gradient up to float summation order. Ranks with fewer
micro-batches run zero-loss forward/backward passes so every rank joins every collective; gradients are
synchronised once per mini-batch (``set_requires_gradient_sync`` / ``no_sync``).

Ranks run the single process's lean forward (chunked LM head; shared prompts under DDP), inside the wrapper's
forward so its hooks see every parameter used (:func:`rank_forward`, :func:`drmas_train.model.logprobs.call_as_forward`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.optim import ModelOptimizer
from drmas_train.collect.samples import Sample


def rank_forward(model: torch.nn.Module) -> dict[str, Any]:
    """Forward settings forced on a rank's update and π_old recompute (both must use the same, so the first PPO
    ratio is exactly 1); merged over the run's own.

    Both wrappers take the lean forward of :func:`drmas_train.model.logprobs.forward_logprobs`: the chunked LM head
    runs inside the wrapper's forward (:func:`~drmas_train.model.logprobs.call_as_forward`), so FSDP2 all-gathers
    the root's parameters and DDP arms its all-reduce around it. DDP also shares prompts. FSDP2 does not
    (``share_prompts=False``): every per-layer FSDP2 module all-gathers its shard on each call, so the ranks of one
    pass must call the layers equally often, but the shared-prompt forward calls each layer twice (prefix, then
    the rows on its cache) only in micro-batches whose prompts repeat, and once in the others and in the idle
    pass (the collectives would not line up); and in the backward a layer's prefix keys/values receive their
    gradient through the cache after the layer's suffix post-backward has resharded its weights.

    Returns:
        ``{}`` (DDP, plain module) or ``{"share_prompts": False}`` (an FSDP2 module).
    """
    from drmas_train.model.logprobs import is_fsdp2

    return {"share_prompts": False} if is_fsdp2(model) else {}


__all__ = ["rank_forward", "STRATEGIES", "resolve_strategy", "wrap_model", "unwrap_model", "dp_ppo_update"]

#: accepted strategies (``auto`` resolves to one of the others).
STRATEGIES = ("auto", "fsdp2", "ddp")


def resolve_strategy(strategy: str, device_type: str) -> str:
    """``auto`` -> ``fsdp2`` on CPU/gloo and CUDA/NCCL alike (torch >= 2.6 exports ``fully_shard``; checked on
    CPU with torch 2.13), else ``ddp``; ``fsdp2`` / ``ddp`` pass through. ``device_type`` is ``cpu`` or ``cuda``.

    Raises:
        ValueError: an unknown strategy, or ``fsdp2`` on a torch without ``fully_shard``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {strategy!r}; accepted: {list(STRATEGIES)}")
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        if strategy == "fsdp2":
            raise ValueError(f"distributed.strategy=fsdp2 needs torch >= 2.6 (fully_shard); this is {torch.__version__}; "
                             "use ddp") from None  # fmt: skip
        return "ddp"
    return "fsdp2" if strategy == "auto" else strategy


def _layer_classes(model: Any) -> tuple[str, ...]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return tuple(getattr(base, "_no_split_modules", None) or ())


def wrap_model(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    """Shard (``fsdp2``) or replicate (``ddp``) ``model`` over the default process group (already initialised).

    FSDP2: ``fully_shard`` on every module whose class is in the HF model's ``_no_split_modules`` (its decoder
    layers), then on the root, so tied embeddings stay in one root group. Build the optimizer *after* this call
    (FSDP2 swaps the parameters for DTensor shards).
    """
    model.to(device)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        names = _layer_classes(model)
        for module in list(model.modules()):
            if type(module).__name__ in names:
                fully_shard(module)
        fully_shard(model)
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    raise ValueError(f"wrap_model: strategy must be 'fsdp2' or 'ddp', got {strategy!r}")


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module inside a DDP wrapper (FSDP2 modules are the HF module itself)."""
    from drmas_train.model.logprobs import unwrap_ddp

    return unwrap_ddp(model)


def _sync_context(model: torch.nn.Module, sync: bool):
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
        return nullcontext()
    if hasattr(model, "no_sync") and not sync:  # DDP
        return model.no_sync()
    return nullcontext()


def _idle_step(model: torch.nn.Module, pad_token_id: int) -> None:
    """A forward/backward with zero loss: joins the collectives of a micro-step without changing gradients."""
    device = next(unwrap_model(model).parameters()).device
    out = model(input_ids=torch.full((1, 1), int(pad_token_id), device=device))
    (out.logits.float().sum() * 0.0).backward()


def dp_ppo_update(
    model: torch.nn.Module,
    opt: ModelOptimizer,
    samples: Sequence[Sample],
    advantages: np.ndarray,
    *,
    rank: int,
    world_size: int,
    pad_token_id: int,
    **update_kwargs: Any,
) -> dict[str, float]:
    """This rank's share of the PPO epochs of one model; every rank of the group must call it with the same data.

    It is :func:`drmas_train.algorithm.update.ppo_update` itself, with a :class:`~drmas_train.algorithm.update.RankShare`: the same
    micro-batch plan on every rank, rank ``r`` running micro-batches ``r, r + N, ...`` (loss scaled by N so the
    averaged gradient is the single-process sum), zero-loss passes for ranks with fewer, gradients reduced on the
    mini-batch's last pass, and the metrics summed over ranks.

    Args: as :func:`drmas_train.algorithm.update.ppo_update` (``update_kwargs``), plus ``rank`` / ``world_size`` of the default
        process group.

    Returns:
        the metrics of :func:`drmas_train.algorithm.update.ppo_update`, reduced over ranks (identical on every rank).

    Raises:
        ValueError: as :func:`drmas_train.algorithm.update.ppo_update`.
    """
    import torch.distributed as dist

    from drmas_train.algorithm.update import RankShare, ppo_update

    def reduce(sums: dict[str, float], weight: float) -> tuple[dict[str, float], float]:
        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, (sums, weight))
        total: dict[str, float] = defaultdict(float)
        for part, _ in gathered:
            for k, v in part.items():
                total[k] += v
        return dict(total), sum(w for _, w in gathered)

    def agree_budget(tokens: int) -> int:
        t = torch.tensor([int(tokens)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    share = RankShare(rank=rank, world_size=world_size, sync=lambda last: _sync_context(model, sync=last),
                      idle_step=lambda: _idle_step(model, pad_token_id), reduce=reduce, agree_budget=agree_budget)  # fmt: skip
    update_kwargs = {**update_kwargs, **rank_forward(model)}
    return ppo_update(model, opt, samples, advantages, pad_token_id=pad_token_id, share=share, **update_kwargs)
