"""Mixed precision of the update: bf16 autocast where the hardware runs bf16 matmuls natively.

bf16 autocast (``torch.autocast``) runs the model's matmuls in bfloat16 while the weights, the optimizer state
and the log-softmax stay in float32. It pays off on CUDA GPUs with bf16 support and on CPUs with Intel AMX tiles
(Sapphire Rapids and later), whose oneDNN kernels compute bf16 matmuls natively; on AVX2/AVX-512 CPUs without
AMX (or AVX512-BF16) bf16 matmuls are emulated and slower than float32, so ``auto`` leaves them in float32.
bf16 keeps 8 bits of mantissa: per-token log-probs differ from float32 by a few 1e-2 nats (measured in
docs/update-performance.md), which moves the PPO ratio by a few percent when the rollout ran in float32 — the
policy-loss clip bounds that, and a backend that also samples in bf16 keeps the ratio near 1.
"""

from __future__ import annotations

import logging

import torch

__all__ = ["AUTOCAST_MODES", "bf16_native", "resolve_autocast"]

#: accepted values of ``optim.autocast``.
AUTOCAST_MODES = ("off", "bf16", "auto")

_log = logging.getLogger(__name__)


def bf16_native(device: torch.device | str) -> bool:
    """True when ``device`` computes bf16 matmuls natively: CUDA with bf16 support, or a CPU with AMX tiles."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        capability = str(torch.backends.cpu.get_cpu_capability()).upper()
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        return "AMX" in capability or bool(amx())
    return False


def resolve_autocast(mode: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype for ``optim.autocast`` = ``mode`` on ``device``.

    ``off`` -> None (float32); ``bf16`` -> ``torch.bfloat16`` (logs a warning where it is emulated, i.e. slower);
    ``auto`` -> ``torch.bfloat16`` where :func:`bf16_native`, else None.

    Raises:
        ValueError: ``mode`` not in :data:`AUTOCAST_MODES`.
    """
    if mode not in AUTOCAST_MODES:
        raise ValueError(f"autocast mode {mode!r} is not one of {list(AUTOCAST_MODES)}")
    if mode == "off":
        return None
    native = bf16_native(device)
    if mode == "auto":
        return torch.bfloat16 if native else None
    if not native:
        _log.warning("optim.autocast=bf16 on %s without native bf16 matmuls (no AMX / CUDA bf16): expect it slower "
                     "than float32; 'auto' would keep float32 here", device)  # fmt: skip
    return torch.bfloat16
