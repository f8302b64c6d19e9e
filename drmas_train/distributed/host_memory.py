"""Host memory of a training rank process: how much it holds, and keeping glibc's ``malloc`` from holding freed memory.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block of at least ``M_MMAP_THRESHOLD`` bytes with its own
``mmap`` and unmaps it on ``free``, so its pages go back to the OS at once; smaller blocks come from the heap, whose
freed memory stays in the process (only a free stretch at the top of the heap is returned). The threshold starts at
128 KiB but is *dynamic*: each time an mmap'ed block is freed, the threshold rises to that block's size, up to
32 MiB on 64-bit (``mallopt(3)``, ``M_MMAP_THRESHOLD``). The first micro-batch of an update frees its activations,
the threshold climbs past their sizes (a (2048, 1536) float32 MLP activation of SmolLM2 is 12 MiB), and from then
on every activation of every later micro-batch lives in the heap: the process keeps the largest micro-batch's
activations as freed-but-resident heap memory, on top of whatever the next allocations need, which fragmentation
inflates further. Measured on a SmolLM2-135M DDP rank (``benchmarks/perf/rank_memory.py``, where this is the only
change): the update's peak 7.4 -> 6.3 GiB, held between updates 5.3 -> 2.5 GiB (docs/scaling.md, "Memory of a
training rank").

:func:`cap_mmap_threshold` fixes the threshold (setting it with ``mallopt`` turns the dynamic rise off), so blocks of
at least that size are always mmap'ed and returned on ``free``; :func:`release_freed_memory` hands the heap's free
pages back to the OS (``malloc_trim(0)``). Both do nothing where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
from collections.abc import Mapping
from functools import cache

__all__ = ["DEFAULT_MMAP_THRESHOLD", "cap_mmap_threshold", "env_sets_mmap_threshold", "release_freed_memory",
           "rss_mb", "peak_rss_mb"]  # fmt: skip

#: glibc's initial ``M_MMAP_THRESHOLD`` (128 KiB); :func:`cap_mmap_threshold` keeps it, without the dynamic rise.
DEFAULT_MMAP_THRESHOLD = 128 * 1024
_M_MMAP_THRESHOLD = -3  # <malloc.h>
_MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses larger values


@cache
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it exports ``gnu_get_libc_version``), else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:  # pragma: no cover - no dynamic C library
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "malloc_trim") else None


def env_sets_mmap_threshold(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` already sets glibc's mmap threshold: ``MALLOC_MMAP_THRESHOLD_`` or a
    ``glibc.malloc.mmap_threshold`` entry of ``GLIBC_TUNABLES`` (glibc read it at the process's start; drmas then
    leaves it as the user chose)."""
    if environ.get("MALLOC_MMAP_THRESHOLD_", "").strip():
        return True
    return re.search(r"(^|:)glibc\.malloc\.mmap_threshold=", environ.get("GLIBC_TUNABLES", "")) is not None


def cap_mmap_threshold(
    nbytes: int = DEFAULT_MMAP_THRESHOLD, environ: Mapping[str, str] | None = None
) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``nbytes`` for the rest of this process (see the module docstring).

    Args:
        nbytes: blocks of at least this many bytes are mmap'ed (and unmapped on ``free``); 0 leaves glibc's dynamic
            default. environ: the environment to consult (default ``os.environ``).

    Returns:
        True when the threshold was set; False with ``nbytes == 0``, without glibc, or when the environment sets the
        threshold itself (:func:`env_sets_mmap_threshold`).

    Raises:
        ValueError: ``nbytes`` negative or above glibc's 32 MiB maximum.
    """
    if not 0 <= nbytes <= _MAX_MMAP_THRESHOLD:
        raise ValueError(
            f"mmap threshold must be in [0, {_MAX_MMAP_THRESHOLD}] bytes (0 = glibc's default), got {nbytes}"
        )
    libc = _glibc()
    if nbytes == 0 or libc is None or env_sets_mmap_threshold(os.environ if environ is None else environ):
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, int(nbytes)))


def release_freed_memory() -> bool:
    """Collect garbage, then return the free pages of glibc's heaps to the OS (``malloc_trim(0)``); True when glibc
    released memory. Call it where a rank goes idle (after its update) so that the memory
    freed by the update does not stay resident while the rollout runs."""
    gc.collect()
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def rss_mb() -> float:
    """This process's resident memory now, in MiB (``VmRSS`` of ``/proc/self/status``; 0.0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0.0


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (``getrusage``: Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
