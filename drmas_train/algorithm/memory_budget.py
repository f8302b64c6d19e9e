"""The token budget of one forward/backward micro-batch, chosen from the memory that is free (``micro_batch_tokens: auto``).

How (docs/update-performance.md):

1. **Bytes per token, measured.** One probe forward of a single sequence of the batch's typical length runs
   through the same path as the update (:func:`drmas_train.model.logprobs.forward_logprobs`, chunked LM head) with a
   ``torch.autograd.graph.saved_tensors_hooks`` counter: it adds up the distinct storages autograd keeps for the
   backward, parameters excluded. Divided by the probe's length this is the activation memory one token of a
   micro-batch holds until its backward (attention's quadratic part included at that length). It is cached per
   model and length bucket (powers of two).
2. **Free memory.** CUDA: ``torch.cuda.mem_get_info``; CPU: ``psutil.virtual_memory().available``, capped by the
   cgroup v2 limit (``memory.max - memory.current``) when the process runs in a container with one.
3. **Budget** = ``fraction * free / bytes_per_token`` (``fraction`` = 0.25 by default: the backward's own
   temporaries, the LM-head chunks, allocator slack and the rest of the process need the rest), clamped to
   ``[longest sample, max_tokens]`` (16384 by default: beyond a few thousand tokens a bigger micro-batch does not
   make a CPU update faster, it only holds more memory).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["activation_bytes_per_token", "auto_micro_batch_tokens", "free_memory_bytes"]

_CACHE: weakref.WeakKeyDictionary[Any, dict[int, float]] = weakref.WeakKeyDictionary()


def _cgroup_free_bytes() -> int | None:
    """``memory.max - memory.current`` of this process's cgroup v2, or None without a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(int(limit) - int((root / "memory.current").read_text().strip()), 0)
    except (OSError, ValueError):
        return None


def free_memory_bytes(device: torch.device | str) -> int:
    """Bytes that can still be allocated on ``device`` (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    free = int(psutil.virtual_memory().available)
    cgroup = _cgroup_free_bytes()
    return min(free, cgroup) if cgroup is not None else free


def activation_bytes_per_token(
    model: Any, length: int, *, probe: Callable[..., Any] | None = None, **forward_kwargs: Any
) -> float:
    """Bytes autograd saves per token for one sequence of ``length`` tokens (half prompt, half response).

    Args:
        model: the causal LM (train mode as in the update; its parameters are not counted).
        length: probe length in tokens (>= 2).
        probe: ``probe(model, prompt_ids, response_ids, pad_token_id=...) -> tensor`` the update's forward (default:
            :func:`drmas_train.model.logprobs.forward_logprobs`; the critic's update passes
            :func:`drmas_train.model.value_model.forward_values`).
        forward_kwargs: passed to ``probe`` (``lm_head_chunk``, ...).

    Raises:
        ValueError: ``length < 2``.
    """
    from drmas_train.model.logprobs import forward_logprobs

    probe = probe or forward_logprobs
    if length < 2:
        raise ValueError(f"probe length must be >= 2 tokens, got {length}")
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    token = int(getattr(getattr(model, "config", None), "bos_token_id", None) or 1)
    half = length // 2
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.enable_grad():
        out = probe(
            model, [[token] * half], [[token] * (length - half)], pad_token_id=token, **forward_kwargs
        )
    del out  # frees the graph
    return sum(seen.values()) / length


def auto_micro_batch_tokens(
    model: Any,
    typical_length: int,
    *,
    fraction: float = 0.25,
    max_tokens: int = 1 << 14,
    free_bytes: int | None = None,
    probe: Callable[..., Any] | None = None,
    **forward_kwargs: Any,
) -> int:
    """Token budget of a micro-batch that fits ``fraction`` of the free memory (see the module docstring).

    Args:
        model: the model to update.
        typical_length: the longest sample (prompt + response tokens) of the batch.
        fraction: share of the free memory for the saved activations, in (0, 1].
        max_tokens: upper clamp.
        free_bytes: free memory to assume (default: measured by :func:`free_memory_bytes`).
        probe, forward_kwargs: see :func:`activation_bytes_per_token`.

    Returns:
        the budget in tokens, ``>= typical_length``.

    Raises:
        ValueError: ``fraction`` outside (0, 1] or ``typical_length < 1``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if typical_length < 1:
        raise ValueError(f"typical_length must be >= 1, got {typical_length}")
    bucket = max(2, 1 << (int(typical_length) - 1).bit_length())  # next power of two
    per_model = _CACHE.setdefault(model, {})
    if bucket not in per_model:
        per_model[bucket] = activation_bytes_per_token(model, bucket, probe=probe, **forward_kwargs)
    if free_bytes is None:
        free_bytes = free_memory_bytes(next(model.parameters()).device)
    budget = int(fraction * free_bytes / max(per_model[bucket], 1.0))
    return max(int(typical_length), min(budget, int(max_tokens)))
