"""CPU threads for torch: as many as the cores this process may run on, and a warning when others compete for them.

On a small machine oversubscription is catastrophic rather than proportional: two torch processes with two
threads each on two cores slowed a lock-step rollout about tenfold (issue 13: iterations of 488-593 s instead of
48-60 s), because torch's intra-op threads spin-wait on each other while the OS time-slices them.
"""

from __future__ import annotations

import logging
import os

import torch

__all__ = ["available_cores", "busy_cores", "configure_threads", "oversubscription"]

_log = logging.getLogger(__name__)
_warned = False  # the oversubscription check ran (once per process)


def available_cores() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``, which honours taskset/cgroup cpusets), else
    ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


def oversubscription(num_threads: int, cores: int, load: float) -> str | None:
    """A warning text when ``num_threads`` more threads would oversubscribe ``cores``, else None.

    Rule: the cores other processes keep busy now (:func:`busy_cores`, measured before this run starts its work)
    plus the threads we add exceed the cores by more than one thread's worth: ``load + num_threads > cores + 1``.
    A dedicated machine has well under 1 busy core; another busy torch process on the same cores adds its thread
    count.

    Args:
        num_threads: threads this process will run. cores: cores available to it. load: cores others keep busy.
    """
    if load + num_threads <= cores + 1:
        return None
    return (
        f"the machine looks oversubscribed: {load:.1f} cores kept busy by other processes + {num_threads} torch "
        f"threads here > {cores} available cores; torch threads then wait on each other and a run can be many "
        f"times slower. Stop the other jobs, or give each process its own cores (taskset) and set "
        f"run.num_threads accordingly."
    )


def busy_cores(interval_s: float = 0.25) -> float:
    """Cores that other processes keep busy right now: the utilisation of the cores this process may run on,
    measured over ``interval_s`` seconds while this process sleeps (``psutil.cpu_percent(percpu=True)``), in cores
    (0 .. :func:`available_cores`).

    Unlike the 1-minute load average, a process that finished a few seconds ago no longer counts.
    """
    import psutil

    per_cpu = psutil.cpu_percent(interval=interval_s, percpu=True)
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu))
    return sum(per_cpu[i] for i in mine if i < len(per_cpu)) / 100.0


def _omp_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def configure_threads(requested: int = 0, *, load: float | None = None) -> int:
    """Set torch's intra-op threads and warn once per process when the machine is oversubscribed.

    Args:
        requested: threads to use; 0 = ``OMP_NUM_THREADS`` when the environment sets it (an explicit request),
            else :func:`available_cores`.
        load: the cores other processes keep busy (default: :func:`busy_cores`, measured now; tests pass their own).

    Returns:
        the number of threads set.

    Raises:
        ValueError: ``requested < 0``.
    """
    global _warned
    if requested < 0:
        raise ValueError(f"num_threads must be >= 0 (0 = all available cores), got {requested}")
    cores = available_cores()
    threads = requested or _omp_threads() or cores
    torch.set_num_threads(threads)
    if _warned:  # checked once per process (measuring takes a quarter of a second)
        return threads
    _warned = True
    message = oversubscription(threads, cores, busy_cores() if load is None else load)
    if message:
        _log.warning(message)
    return threads
