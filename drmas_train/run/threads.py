"""CPU threads for torch: as many as the cores this process may run on, and a warning when others compete for them.

On a small machine oversubscription is catastrophic rather than proportional: two torch processes with two
threads each on two cores slowed a lock-step rollout about tenfold (issue 13: iterations of 488-593 s instead of
48-60 s), because torch's intra-op threads spin-wait on each other while the OS time-slices them.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import torch

__all__ = ["CpuUse", "available_cores", "busy_cores", "configure_threads", "cpu_use", "oversubscription"]

_log = logging.getLogger(__name__)
_warned = False  # the oversubscription check ran (once per process)


def available_cores() -> int:
    """CPUs this process may run on (``os.sched_getaffinity``, which honours taskset/cgroup cpusets), else
    ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """CPU use of the cores this process may run on over one short window, in cores (0 .. available cores).

    Attributes:
        others: cores other processes of this machine kept busy (user, nice, system, irq, softirq time of those
            cores minus the user + system time of this process and its descendants).
        own: cores this process and its descendants used (its threads: imports, data loading; its child processes:
            e.g. the math envs' grading workers starting) — not "other work".
        steal: cores the hypervisor gave to other virtual machines (``steal`` time): it slows this run, but no
            process here causes it, so it is reported and never counted as other processes.
        interval_s: the window's length, in seconds.
    """

    others: float
    own: float = 0.0
    steal: float = 0.0
    interval_s: float = 0.0


def oversubscription(num_threads: int, cores: int, load: float | CpuUse) -> str | None:
    """A warning text when ``num_threads`` more threads would oversubscribe ``cores``, else None.

    Rule: the cores other processes keep busy now (:func:`cpu_use`, measured before this run starts its work)
    plus the threads we add exceed the cores by more than one thread's worth: ``others + num_threads > cores + 1``.
    A dedicated machine has well under 1 busy core; another busy torch process on the same cores adds its thread
    count. The text says what was measured: over which window, this process's own use and the hypervisor's steal.

    Args:
        num_threads: threads this process will run. cores: cores available to it. load: cores others keep busy
            (a float), or the whole measurement (:class:`CpuUse`).
    """
    use = load if isinstance(load, CpuUse) else CpuUse(others=float(load))
    if use.others + num_threads <= cores + 1:
        return None
    seen = (f"over the last {use.interval_s:.1f} s, other processes kept {use.others:.1f} of {cores} cores busy "
            f"(this process: {use.own:.1f}, hypervisor steal: {use.steal:.1f})" if use.interval_s
            else f"{use.others:.1f} cores kept busy by other processes")  # fmt: skip
    return (
        f"the machine looks oversubscribed: {seen}, + {num_threads} torch threads here > {cores} available cores; "
        f"torch threads then wait on each other and a run can be many times slower. Stop the other jobs (ps, top), "
        f"or give each process its own cores (taskset) and set run.num_threads accordingly."
    )


def _busy(t) -> float:
    # guest time is already inside user / nice on Linux; idle, iowait and steal are not this machine's work
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq"))


def _family_seconds(me) -> dict[int, float]:
    """``pid -> user + system CPU seconds`` of ``me`` (a ``psutil.Process``) and its living descendants."""
    import psutil

    out = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        out[proc.pid] = t.user + t.system
    return out


def cpu_use(interval_s: float = 0.5) -> CpuUse:
    """What other processes keep busy right now on the cores this process may run on: system CPU times
    (``psutil.cpu_times(percpu=True)``, i.e. ``/proc/stat``) and this process's own times
    (``psutil.Process().cpu_times()``) read before and after ``interval_s`` seconds of sleep.

    Unlike the 1-minute load average, a process that finished a few seconds ago (the set-up's pip) no longer counts;
    unlike ``psutil.cpu_percent``, neither this process's own threads, nor its child processes, nor the hypervisor's
    steal time count as other processes.
    """
    import psutil

    me = psutil.Process()
    per_cpu0, own0, t0 = psutil.cpu_times(percpu=True), _family_seconds(me), time.monotonic()
    time.sleep(interval_s)
    per_cpu1, own1, t1 = psutil.cpu_times(percpu=True), _family_seconds(me), time.monotonic()
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(len(per_cpu1))
    idx = [i for i in mine if i < min(len(per_cpu0), len(per_cpu1))]
    elapsed = max(t1 - t0, 1e-6)
    busy = sum(_busy(per_cpu1[i]) - _busy(per_cpu0[i]) for i in idx)
    steal = sum(getattr(per_cpu1[i], "steal", 0.0) - getattr(per_cpu0[i], "steal", 0.0) for i in idx)
    # this process and its descendants (e.g. the math envs' grading workers, spawned and importing as the run
    # starts): the run's own work, not other processes'. A child that exits within the window takes its time with it.
    own = sum(own1.get(pid, 0.0) - before for pid, before in own0.items() if pid in own1)
    own += sum(v for pid, v in own1.items() if pid not in own0)
    return CpuUse(others=max(busy - own, 0.0) / elapsed, own=max(own, 0.0) / elapsed,
                  steal=max(steal, 0.0) / elapsed, interval_s=interval_s)  # fmt: skip


def busy_cores(interval_s: float = 0.5) -> float:
    """Cores that other processes keep busy right now (:attr:`CpuUse.others` of :func:`cpu_use`)."""
    return cpu_use(interval_s).others


def _omp_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def configure_threads(requested: int = 0, *, load: float | None = None) -> int:
    """Set torch's intra-op threads and warn once per process when the machine is oversubscribed.

    Args:
        requested: threads to use; 0 = ``OMP_NUM_THREADS`` when the environment sets it (an explicit request),
            else :func:`available_cores`.
        load: the cores other processes keep busy (default: :func:`cpu_use`, measured now; tests pass their own).

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
    if _warned:  # checked once per process (measuring takes half a second)
        return threads
    _warned = True
    message = oversubscription(threads, cores, cpu_use() if load is None else load)
    if message:
        _log.warning(message)
    return threads
