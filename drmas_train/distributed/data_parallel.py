"""Data-parallel training of one model across the ranks of a ``torch.distributed`` process group.

Shape legend: **B** samples (agent calls) of this model, **T** response tokens.

:func:`wrap_model` shards the model with FSDP2 (``torch.distributed.fsdp.fully_shard``: each decoder layer, then
the root) or wraps it in DDP. FSDP2 runs on CUDA/NCCL and on CPU/gloo (checked with torch 2.13), so ``auto``
is FSDP2 everywhere; ``ddp`` keeps a full replica per rank.

:func:`dp_ppo_update` is :func:`drmas_train.update.ppo_update` spread over ranks: every rank holds the whole
batch (token ids are small), draws the same mini-batch permutation, cuts each mini-batch into the same
token-budget micro-batches and runs micro-batch ``k`` on rank ``k mod world``. The loss of a micro-batch is
divided by ``denom / world`` (``denom`` = the whole mini-batch's, as in the single-process update) because both
FSDP2's reduce-scatter and DDP's all-reduce *average* gradients over ranks: the synchronised gradient is then
the sum over all micro-batches, i.e. the single-process gradient up to float summation order. Ranks with fewer
micro-batches run zero-loss forward/backward passes so every rank joins every collective; gradients are
synchronised once per mini-batch (``set_requires_gradient_sync`` / ``no_sync``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch

from drmas_train.losses import PolicyLossConfig
from drmas_train.optim import ModelOptimizer, micro_batches
from drmas_train.samples import Sample
from drmas_train.update import _ADDITIVE, _denominator, _micro_step

__all__ = ["STRATEGIES", "resolve_strategy", "wrap_model", "unwrap_model", "dp_ppo_update"]

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
    return getattr(model, "module", model)


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
    loss_cfg: PolicyLossConfig,
    pad_token_id: int,
    temperature: float,
    ppo_epochs: int = 1,
    mini_batches: int = 1,
    micro_batch_tokens: int = 8192,
    ref_model: Any = None,
    seed: int = 0,
    skip_zero_advantage: bool = True,
) -> dict[str, float]:
    """This rank's share of the PPO epochs of one model; every rank of the group must call it with the same data.

    Args: as :func:`drmas_train.update.ppo_update`, plus ``rank`` / ``world_size`` of the default process group.

    Returns:
        the metrics of :func:`drmas_train.update.ppo_update`, reduced over ranks (identical on every rank).

    Raises:
        ValueError: ``advantages`` not aligned with ``samples``.
    """
    import torch.distributed as dist

    if len(advantages) != len(samples):
        raise ValueError(f"got {len(advantages)} advantages for {len(samples)} samples")
    if not samples:
        return {}
    rng = np.random.default_rng(seed)
    sums: dict[str, float] = defaultdict(float)
    weight, n_mb, norms, skipped = 0.0, 0, [], 0
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
                lengths = [len(s.prompt_ids) + len(s.response_ids) for s in mb_samples]
                n_mb += 1
                micros = micro_batches(lengths, micro_batch_tokens)
                mine = micros[rank::world_size]
                rounds = -(-len(micros) // world_size)  # every rank runs this many forward/backward passes
                for r in range(rounds):
                    with _sync_context(model, sync=r == rounds - 1):
                        if r >= len(mine):
                            _idle_step(model, pad_token_id)
                            continue
                        micro = mine[r]
                        batch = [mb_samples[i] for i in micro]
                        adv = torch.as_tensor(advantages[mb[micro]], dtype=torch.float32)  # (b,)
                        metrics, tokens = _micro_step(model, batch, adv, loss_cfg, pad_token_id, temperature,
                                                      denom / world_size, ref_model)  # fmt: skip
                    for k, v in metrics.items():
                        sums[k] += v / world_size if k in _ADDITIVE else v * tokens
                    weight += tokens
                norm, stepped = opt.step()
                norms.append(norm)
                skipped += not stepped
    finally:
        model.eval()
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, (dict(sums), weight))
    total: dict[str, float] = defaultdict(float)
    for part, _ in gathered:
        for k, v in part.items():
            total[k] += v
    weight = sum(w for _, w in gathered)
    out = {k: v / n_mb if k in _ADDITIVE else v / max(weight, 1.0) for k, v in total.items()}
    finite = [n for n in norms if np.isfinite(n)]
    out.update(
        grad_norm=float(np.mean(finite)) if finite else float("nan"),
        grad_norm_max=float(np.max(finite)) if finite else float("nan"),
        steps=float(len(norms)),
        skipped_steps=float(skipped),
        lr=opt.lr,
    )
    return out
