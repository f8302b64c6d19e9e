"""Mixed precision: float32 master weights, computation in the model's dtype (bf16 where it is native).

**The reference's policy** (``langfengQ/DrMAS verl/workers/fsdp_workers.py``): the actor is loaded in float32
(``torch_dtype = torch.float32 if self._is_actor``, :204-206) and FSDP casts it to bf16 for each forward
(``MixedPrecision(param_dtype=bf16, reduce_dtype=fp32, buffer_dtype=fp32)``, :284-294); only the rollout engine and
the frozen reference hold bf16 weights. AdamW therefore steps float32 parameters: at the paper's lr of 1e-6 a step is
far below bf16's spacing (about 1.2e-4 near 0.02, 7.8e-3 near 1.0), so stepping bf16 weights directly would round
almost every update away (tests/drmas_train/algorithm/test_precision.py measures it).

drmas does the same for every trainable full-weight model: ``models.<key>.dtype`` is the dtype the model *computes*
in, and with ``optim.master_dtype: float32`` (the default) its trained parameters and their AdamW state are float32
(:func:`drmas_train.model.models.load_model` loads them so and marks the model with :data:`COMPUTE_ATTR`). Each
forward then runs under ``torch.autocast`` in the compute dtype (:func:`forward_dtype`): the single process, DDP, the
critic, π_old and the HF rollout engine; FSDP2 casts instead, with ``MixedPrecisionPolicy(param_dtype=<compute>,
reduce_dtype=float32)`` as the reference (:mod:`drmas_train.distributed.data_parallel`). vLLM engines hold
their own copy in the compute dtype and receive the float32 masters cast at each weight sync. LoRA adapters are
float32 (PEFT's ``autocast_adapter_dtype``) over a frozen base in the compute dtype; frozen models and KL references
hold the compute dtype only. ``optim.master_dtype: model`` trains the weights in their own dtype instead (warned).

**Float32 models** (the CPU quickstarts) compute in float32 unless ``optim.autocast`` says otherwise: ``off``;
``bf16``; ``auto``, bf16 where the device computes bf16 matmuls natively (:func:`bf16_native`: CUDA with bf16, or a
CPU whose ISA has AVX512-BF16 or AMX, confirmed by timing both dtypes once). bf16 keeps 8 bits of mantissa:
per-token log-probs differ from float32 by a few 1e-2 nats (docs/update-performance.md).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["AUTOCAST_MODES", "AUTOCAST", "MASTER_DTYPES", "COMPUTE_ATTR", "bf16_native", "cpu_bf16_isa", "bf16_speedup",
           "resolve_autocast", "forward_dtype", "mark_compute_dtype", "frozen_copy", "warn_low_precision_master"]

#: accepted values of ``optim.autocast`` and ``rollout.autocast``.
AUTOCAST_MODES = ("off", "bf16", "auto")
#: their default: float32 models compute in float32 (bf16 only where asked; see docs/quickstart.md for the study
#: that decides whether ``auto`` may become the quickstart's default).
AUTOCAST = "off"
#: accepted values of ``optim.master_dtype``: float32 master weights (the reference), or the model's own dtype.
MASTER_DTYPES = ("float32", "model")
#: attribute set on a model held in a dtype other than the one it computes in: the autocast dtype of its forwards
#: (None: something else casts it, e.g. FSDP2's mixed-precision policy).
COMPUTE_ATTR = "drmas_compute_dtype"
#: bf16 must run a matmul this much faster than float32 for ``auto`` to take it on a CPU with a bf16 ISA.
MIN_SPEEDUP = 1.2

_log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def _proc_cpuinfo() -> str:
    """``/proc/cpuinfo``, read once per process (every autocast resolution of a float32 model asks for the ISA)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_bf16_isa(cpuinfo: str | None = None) -> str | None:
    """The bf16 matmul instructions this CPU has: ``"amx_bf16"``, ``"avx512_bf16"`` or None.

    Read from the ``flags`` of ``/proc/cpuinfo`` (``cpuinfo``: its text, for tests) and from torch's own CPU capability
    (``"AMX"`` in :func:`torch.backends.cpu.get_cpu_capability`) where there is no ``/proc`` (macOS, Windows).
    """
    if cpuinfo is None:
        cpuinfo = _proc_cpuinfo()
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    if "amx_bf16" in flags or "AMX" in str(torch.backends.cpu.get_cpu_capability()).upper():
        return "amx_bf16"
    return "avx512_bf16" if "avx512_bf16" in flags else None


@functools.cache
def bf16_speedup(m: int = 256, k: int = 576, n: int = 1536, repeats: int = 5) -> float:
    """float32 time over bf16 time of one (m, k) @ (k, n) matmul on the CPU, in this process's torch threads
    (the best of ``repeats`` each, after a warm-up): > 1 where bf16 is faster. Measured once per process (cached);
    the default shape is a SmolLM2-135M MLP projection over 256 tokens (about 0.1 s in all)."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    timings = []
    for x, y in ((a, b), (a.bfloat16(), b.bfloat16())):
        x @ y  # warm-up: oneDNN picks and caches its kernel
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            x @ y
            best = min(best, time.perf_counter() - start)
        timings.append(best)
    return timings[0] / max(timings[1], 1e-12)


def bf16_native(device: torch.device | str) -> bool:
    """True when ``device`` computes bf16 matmuls natively, and faster than float32.

    CUDA: ``torch.cuda.is_bf16_supported()``. CPU: the ISA has AVX512-BF16 or AMX (:func:`cpu_bf16_isa`) *and* a
    probe matmul runs at least :data:`MIN_SPEEDUP` times faster in bf16 (:func:`bf16_speedup`), so a CPU whose
    flags promise more than its kernels deliver stays in float32. Other devices: False.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_bf16_isa() is not None and bf16_speedup() >= MIN_SPEEDUP
    return False


def resolve_autocast(mode: str, device: torch.device | str) -> torch.dtype | None:
    """The autocast dtype of a float32 model for ``optim.autocast`` = ``mode`` on ``device``.

    ``off`` -> None (float32); ``bf16`` -> ``torch.bfloat16`` (logs a warning where it is not native, i.e. slower);
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
        _log.warning("optim.autocast=bf16 on %s, which has no native bf16 matmuls (CUDA bf16, AVX512-BF16 or AMX) "
                     "or runs them no faster than float32: expect it slower; 'auto' would keep float32 here", device)  # fmt: skip
    return torch.bfloat16


def _first_float_param(module: Any) -> torch.Tensor | None:
    for p in module.parameters():
        if p.is_floating_point():
            return p
    return None


def forward_dtype(mode: str, module: Any) -> torch.dtype | None:
    """The autocast dtype of ``module``'s forwards (None: no autocast).

    A model marked by :func:`mark_compute_dtype` (float32 masters of a bf16 model) computes in its marked dtype,
    whatever ``mode``; a float32 model follows ``optim.autocast`` = ``mode`` (:func:`resolve_autocast`); a model
    held in a low-precision dtype computes in it (no autocast).
    """
    if hasattr(module, COMPUTE_ATTR):
        return getattr(module, COMPUTE_ATTR)
    p = _first_float_param(module)
    if p is None or p.dtype != torch.float32:
        return None
    return resolve_autocast(mode, p.device)


def mark_compute_dtype(module: Any, dtype: torch.dtype | None) -> None:
    """Mark ``module`` (held in float32) as computing in ``dtype``: :func:`forward_dtype` gives it to every forward.
    ``None`` marks a module whose wrapper casts the weights itself (no autocast)."""
    setattr(module, COMPUTE_ATTR, dtype)


def frozen_copy(model: Any) -> Any:
    """A frozen copy of ``model`` (eval mode, no gradients) for a KL reference, held in the dtype ``model`` computes
    in: float32 masters of a bf16 model give a bf16 copy, as the reference's ref model
    (``verl/workers/fsdp_workers.py:204-206``: only the actor is float32)."""
    import copy

    ref = copy.deepcopy(model).eval().requires_grad_(False)
    dtype = getattr(ref, COMPUTE_ATTR, None)
    if dtype is not None:
        ref.to(dtype)
        delattr(ref, COMPUTE_ATTR)
    return ref


def warn_low_precision_master(model_id: str, dtype: str, lr: float) -> None:
    """The warning of ``optim.master_dtype: model`` on a model held in ``dtype`` below float32: AdamW then steps the
    low-precision weights directly, and steps below half their spacing round away."""
    if dtype == "float32":
        return
    mantissa = {"bfloat16": 7, "float16": 10}.get(dtype, 23)
    near = 2.0 ** (math.floor(math.log2(0.02)) - mantissa)  # the spacing of the dtype's numbers near 0.02
    _log.warning("model %r trains its %s weights directly (optim.master_dtype: model): an AdamW step of about lr=%g "
                 "is lost wherever it is below half the weight's spacing (%.1e near 0.02, %.1e near 1.0 in %s); the "
                 "loss/%s/update_changed_frac metric shows the share of weights that still move. The reference keeps "
                 "float32 master weights (optim.master_dtype: float32)", model_id, dtype, lr, near, 2.0**-mantissa,
                 dtype, model_id)  # fmt: skip
