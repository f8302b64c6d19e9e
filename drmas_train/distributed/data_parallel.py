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
micro-batches run zero-loss forward/backward passes so every rank joins every collective. FSDP2 reduce-scatters
the gradients after every pass (a rank never holds more than its shard of them between passes); DDP all-reduces
once per mini-batch (``no_sync`` before its last pass).

Ranks run the single process's lean forward (chunked LM head; shared prompts under DDP), inside the wrapper's
forward so its hooks see every parameter used (:func:`call_as_forward`, :func:`rank_forward`). Everything that knows
about ranks lives here: the algorithm stage exposes the seams (:class:`~drmas_train.algorithm.update.UpdateHooks`,
:class:`~drmas_train.model.logprobs.Forward`) and :func:`rank_hooks` fills them for one rank.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from drmas_train.algorithm.optim import ModelOptimizer
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import UpdateHooks, ppo_update
from drmas_train.collect.samples import Sample
from drmas_train.distributed.config import STRATEGIES
from drmas_train.model.logprobs import Forward
from drmas_train.model.precision import COMPUTE_ATTR, mark_compute_dtype

try:  # torch >= 2.6
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # pragma: no cover - older torch: DDP only
    FSDPModule = MixedPrecisionPolicy = fully_shard = None


def unwrap_ddp(model: Any) -> Any:
    """The module inside a ``DistributedDataParallel`` wrapper; any other model unchanged (an FSDP2 module is the
    HF module itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def is_fsdp2(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (``fully_shard``); False on a torch without FSDP2 (< 2.6)."""
    return FSDPModule is not None and isinstance(model, FSDPModule)


def call_as_forward(model: torch.nn.Module, fn: Callable[[], Any]) -> Any:
    """``fn()`` run as the forward of ``model`` (a DDP wrapper, an FSDP2 root, or a plain module).

    ``model()`` is called with ``forward`` of the module it dispatches to (``model.module`` for DDP, else
    ``model``) temporarily replaced by ``fn``, so every forward hook of the wrapper runs around ``fn``: FSDP2's root
    pre-forward all-gathers the root's parameters (the embeddings, final norm and LM head that ``fn`` uses
    directly) and its post-forward registers the pre-backward hooks on ``fn``'s output tensors (the root's
    gradients are reduce-scattered by its post-backward callback); DDP's pre-forward runs and its post-forward
    calls ``prepare_for_backward`` (without it a synchronising backward would not all-reduce). This is what
    ``torch.distributed.fsdp.register_fsdp_forward_method`` does for FSDP2, in a form that also covers DDP.
    ``fn`` must use every trainable parameter under DDP (``find_unused_parameters=False``), as the model's own
    forward does.

    Returns:
        whatever ``fn`` returns (after the wrapper's post-forward, which may register hooks on its tensors).
    """
    inner = unwrap_ddp(model)
    shadowed = "forward" in vars(inner)
    previous = vars(inner).get("forward")
    inner.forward = lambda *args, **kwargs: fn()  # an instance attribute shadows the class's forward
    try:
        return model()
    finally:
        if shadowed:
            inner.forward = previous
        else:
            del inner.forward


def rank_forward(model: torch.nn.Module) -> Forward:
    """How a rank's forwards reach the parameters of its wrapped ``model``: the plain path calls the wrapper, the
    lean path runs as the wrapper's forward (:func:`call_as_forward`)."""
    return Forward(module=unwrap_ddp(model), call=model, run=lambda fn: call_as_forward(model, fn))


def rank_settings(model: torch.nn.Module, settings: UpdateSettings) -> UpdateSettings:
    """The run's update settings as a rank must use them, for its update and its π_old recompute alike (both must
    use the same, so the first PPO ratio is exactly 1).

    Both wrappers take the lean forward of :func:`drmas_train.model.logprobs.forward_logprobs` (the chunked LM head
    inside the wrapper's forward, :func:`rank_forward`), so FSDP2 all-gathers the root's parameters and DDP arms its
    all-reduce around it. DDP also shares prompts. FSDP2 does not (``share_prompts=False``): every per-layer FSDP2
    module all-gathers its shard on each call, so the ranks of one pass must call the layers equally often, but the
    shared-prompt forward calls each layer twice (prefix, then the rows on its cache) only in micro-batches whose
    prompts repeat, and once in the others and in the idle pass (the collectives would not line up); and in the
    backward a layer's prefix keys/values receive their gradient through the cache after the layer's suffix
    post-backward has resharded its weights.
    """
    return settings.replace(share_prompts=False) if is_fsdp2(model) else settings


__all__ = ["rank_forward", "rank_settings", "rank_hooks", "rank_passes", "resolve_strategy", "wrap_model",
           "unwrap_ddp", "is_fsdp2", "call_as_forward", "dp_ppo_update"]


def resolve_strategy(strategy: str, device_type: str, world_size: int | None = None) -> str:
    """``auto`` -> ``fsdp2`` on CPU/gloo and CUDA/NCCL alike (torch >= 2.6 exports ``fully_shard``; checked on
    CPU with torch 2.13), else ``ddp``; and ``none`` (the plain module, :func:`wrap_model`) when ``world_size`` is 1:
    one rank has nothing to shard or average, and FSDP2's per-layer gathers forbid the shared-prompt forward
    (:func:`rank_settings`), which made a one-rank update twice the single process's (docs/scaling.md). ``fsdp2`` /
    ``ddp`` pass through. ``device_type`` is ``cpu`` or ``cuda``.

    Raises:
        ValueError: an unknown strategy, or ``fsdp2`` on a torch without ``fully_shard``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown distributed strategy {strategy!r}; accepted: {list(STRATEGIES)}")
    if strategy == "auto" and world_size == 1:
        return "none"
    if fully_shard is None:
        if strategy == "fsdp2":
            raise ValueError(f"distributed.strategy=fsdp2 needs torch >= 2.6 (fully_shard); this is {torch.__version__}; "
                             "use ddp") from None  # fmt: skip
        return "ddp"
    return "fsdp2" if strategy == "auto" else strategy


def _layer_classes(model: Any) -> tuple[str, ...]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return tuple(getattr(base, "_no_split_modules", None) or ())


def wrap_model(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    """Shard (``fsdp2``) or replicate (``ddp``) ``model`` over the default process group (already initialised), or
    (``none``, one rank) leave it a plain module on ``device``.

    FSDP2: ``fully_shard`` on every module whose class is in the HF model's ``_no_split_modules`` (its decoder
    layers), then on the root, so tied embeddings stay in one root group. Build the optimizer *after* this call
    (FSDP2 swaps the parameters for DTensor shards). A model of float32 master weights that computes in bf16
    (:func:`drmas_train.model.precision.forward_dtype`) is cast by FSDP2 itself, as the reference
    (``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)``, ``langfengQ/DrMAS verl/workers/fsdp_workers.py:284-294``):
    ``MixedPrecisionPolicy(param_dtype=<compute dtype>, reduce_dtype=float32)``, the shards and the optimizer staying
    float32, and no autocast on top (the mark is cleared). DDP keeps the autocast.
    """
    model.to(device)
    if strategy == "none":  # one rank: the plain module (autocast as in one process)
        return model
    if strategy == "fsdp2":
        compute = getattr(model, COMPUTE_ATTR, None)
        mp = {}
        if compute is not None:
            mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)}
            mark_compute_dtype(model, None)  # FSDP2 casts the gathered weights: no autocast on top
        names = _layer_classes(model)
        for module in list(model.modules()):
            if type(module).__name__ in names:
                fully_shard(module, **mp)
        fully_shard(model, **mp)
        return model
    if strategy == "ddp":
        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    raise ValueError(f"wrap_model: strategy must be 'fsdp2', 'ddp' or 'none', got {strategy!r}")


def _sync_context(model: torch.nn.Module, sync: bool):
    """The gradient synchronisation of one pass (:attr:`UpdateHooks.sync`; ``sync``: gradients must be synchronised
    after it, on the mini-batch's / an agent's last pass).

    FSDP2 reduce-scatters after every pass, so a rank holds only its 1/N shard of the gradients between passes
    (FSDP2 accumulates the reduced shards into ``param.grad``). Deferring the reduce-scatter to the last pass
    (``set_requires_gradient_sync(False)`` before) would keep every layer's *unsharded* gradient until then, a full
    model's worth per rank: the memory FSDP exists to save, for a saving of collectives that gloo cannot overlap
    with compute anyway. The reference does the same (``loss.backward()`` on every micro-batch, no ``no_sync``:
    ``langfengQ/DrMAS verl/workers/actor/dp_actor.py:364-429``). DDP all-reduces only when ``sync`` (``no_sync``
    otherwise): its gradients are full-size on every rank either way, so deferring costs no memory.
    """
    if is_fsdp2(model):
        model.set_requires_gradient_sync(True)
        return nullcontext()
    if hasattr(model, "no_sync") and not sync:  # DDP
        return model.no_sync()
    return nullcontext()


def _idle_step(model: torch.nn.Module, pad_token_id: int) -> None:
    """A forward/backward with zero loss: joins the collectives of a micro-step without changing gradients."""
    device = next(unwrap_ddp(model).parameters()).device
    out = model(input_ids=torch.full((1, 1), int(pad_token_id), device=device))
    (out.logits.float().sum() * 0.0).backward()


def rank_passes(rank: int, world_size: int) -> Callable[[Sequence[Sequence[int]]], list[int | None]]:
    """:attr:`UpdateHooks.passes` of rank ``rank`` of ``world_size``: micro-batches ``rank, rank + N, ...`` of the
    plan, then ``None`` (a zero-loss pass) until every rank has made the same number of passes."""

    def passes(micros: Sequence[Sequence[int]]) -> list[int | None]:
        rounds = -(-len(micros) // world_size)  # passes per rank: every rank joins every collective
        return [k if (k := rank + r * world_size) < len(micros) else None for r in range(rounds)]

    return passes


def rank_hooks(model: torch.nn.Module, *, rank: int, world_size: int, pad_token_id: int) -> UpdateHooks:
    """The :class:`~drmas_train.algorithm.update.UpdateHooks` of one rank of the default process group: its
    micro-batches (:func:`rank_passes`), gradients averaged over ``world_size`` ranks and synchronised by a
    mini-batch's last pass (FSDP2: reduce-scattered after every pass; DDP: ``no_sync`` until the last;
    :func:`_sync_context`), zero-loss idle passes, metrics summed over ranks (``all_gather_object``), an ``"auto"``
    budget agreed as the ranks' minimum (``all_reduce``), and the per-agent gradient statistics summed over the FSDP2
    shards (``all_reduce``; DDP replicas hold the whole gradient, so they need no sum)."""

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

    def sum_shards(values: torch.Tensor) -> torch.Tensor:  # FSDP2: each rank holds a shard of every gradient
        values = values.clone()  # on the gradients' device (NCCL reduces CUDA tensors only)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    return UpdateHooks(forward=rank_forward(model), passes=rank_passes(rank, world_size), average_over=world_size,
                       sync=lambda last: _sync_context(model, sync=last), idle_pass=lambda: _idle_step(model, pad_token_id),
                       reduce=reduce, agree_budget=agree_budget,
                       sum_shards=sum_shards if is_fsdp2(model) else (lambda values: values))  # fmt: skip


def dp_ppo_update(
    model: torch.nn.Module,
    opt: ModelOptimizer,
    samples: Sequence[Sample],
    advantages: np.ndarray,
    settings: UpdateSettings,
    *,
    rank: int,
    world_size: int,
    pad_token_id: int,
    ref_model: Any = None,
    seed: int = 0,
) -> dict[str, float]:
    """This rank's share of the PPO epochs of one model; every rank of the group must call it with the same data.

    It is :func:`drmas_train.algorithm.update.ppo_update` itself with this rank's :func:`rank_hooks` and
    :func:`rank_settings`: the same micro-batch plan on every rank, rank ``r`` running micro-batches ``r, r + N, ...``
    (loss scaled by N so the averaged gradient is the single-process sum), zero-loss passes for ranks with fewer,
    gradients reduced after every pass (FSDP2) or on the mini-batch's last pass (DDP), and the metrics summed over
    ranks.

    Args: as :func:`drmas_train.algorithm.update.ppo_update`, plus ``rank`` / ``world_size`` of the default process
        group.

    Returns:
        the metrics of :func:`drmas_train.algorithm.update.ppo_update`, reduced over ranks (identical on every rank).

    Raises:
        ValueError: as :func:`drmas_train.algorithm.update.ppo_update`.
    """
    hooks = rank_hooks(model, rank=rank, world_size=world_size, pad_token_id=pad_token_id)
    return ppo_update(model, opt, samples, advantages, rank_settings(model, settings), pad_token_id=pad_token_id,
                      ref_model=ref_model, seed=seed, hooks=hooks)  # fmt: skip
