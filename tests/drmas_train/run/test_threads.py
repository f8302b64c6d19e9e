"""Default torch threads from the available cores; one warning when the machine is oversubscribed."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch

from drmas_train.run import threads
from drmas_train.run.config import ConfigError, load_config


@pytest.fixture
def restore_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_warned", False)
    yield
    torch.set_num_threads(before)


def test_default_is_the_available_cores_or_omp_num_threads(monkeypatch, restore_threads):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.available_cores() == 3
    assert threads.configure_threads(0, load=0.0) == 3 and torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.configure_threads(0, load=0.0) == 1 and torch.get_num_threads() == 1
    assert threads.configure_threads(2, load=0.0) == 2  # an explicit run.num_threads wins
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        threads.configure_threads(-1)


def test_oversubscription_rule():
    assert threads.oversubscription(2, 2, load=0.3) is None  # a quiet 2-core machine
    assert threads.oversubscription(2, 2, load=1.0) is None  # one stray busy thread: tolerated
    msg = threads.oversubscription(2, 2, load=2.1)  # another 2-thread torch job on the same 2 cores
    assert msg is not None and "2.1 cores kept busy by other processes" in msg and "2 available cores" in msg
    assert threads.oversubscription(16, 16, load=0.9) is None and threads.oversubscription(8, 16, load=7.0) is None
    assert threads.oversubscription(16, 16, load=4.0) is not None


def test_warns_once(monkeypatch, restore_threads, caplog):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    with caplog.at_level(logging.WARNING, logger="drmas_train.run.threads"):
        threads.configure_threads(0, load=3.0)
        threads.configure_threads(0, load=3.0)
    assert [r.message.startswith("the machine looks oversubscribed") for r in caplog.records] == [True]


def test_config_fields():
    cfg = load_config(overrides=["optim.micro_batch_tokens=auto", "optim.autocast=auto"])
    assert cfg.optim.micro_batch_tokens == "auto" and cfg.run.num_threads == 0
    assert load_config(overrides=["optim.micro_batch_tokens=2048"]).optim.micro_batch_tokens == 2048
    with pytest.raises(ConfigError, match="optim.micro_batch_tokens must be an int >= 1 or 'auto', got 'big'"):
        load_config(overrides=["optim.micro_batch_tokens=big"])
    with pytest.raises(ConfigError, match="optim.autocast='fp16'; accepted: off, bf16, auto"):
        load_config(overrides=["optim.autocast=fp16"])
    with pytest.raises(ConfigError, match="run.num_threads must be >= 0"):
        load_config(overrides=["run.num_threads=-2"])


class _FakeClock:
    """psutil and time as cpu_use reads them: two snapshots 0.5 s apart."""

    def __init__(self, monkeypatch, per_cpu, own):
        import collections

        import psutil

        Times = collections.namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
        Own = collections.namedtuple("Own", "user system children_user children_system")
        snaps = iter([[Times(*t) for t in per_cpu[0]], [Times(*t) for t in per_cpu[1]]])
        owns = iter([Own(*own[0], 0.0, 0.0), Own(*own[1], 0.0, 0.0)])
        clock = iter([100.0, 100.5])
        monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: next(snaps))
        monkeypatch.setattr(psutil, "Process", lambda: type("P", (), {"cpu_times": lambda self: next(owns), "pid": 1,
                                                                      "children": lambda self, recursive=False: []})())
        monkeypatch.setattr(threads.time, "sleep", lambda s: None)
        monkeypatch.setattr(threads.time, "monotonic", lambda: next(clock))


def _t(user=0.0, system=0.0, idle=0.0, steal=0.0):
    return (user, 0.0, system, idle, 0.0, 0.0, 0.0, steal, 0.0, 0.0)


def test_cpu_use_leaves_out_this_process_and_steal(monkeypatch):
    """Issue 40's false alarm: both cores busy over the window, but with this process's own work (imports, data)
    and the hypervisor's steal; no other process. cpu_use says 0 other cores, and configure_threads stays quiet."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    before = [_t(10, 5, 100, 1), _t(10, 5, 100, 1)]
    after = [_t(10.3, 5.1, 100, 1.1), _t(10.3, 5.1, 100, 1.1)]  # per core: 0.4 s busy + 0.1 s steal in 0.5 s
    _FakeClock(monkeypatch, [before, after], own=[(3.0, 1.0), (3.7, 1.1)])  # this process: 0.8 s of CPU
    use = threads.cpu_use()
    assert use == threads.CpuUse(others=pytest.approx(0.0, abs=1e-9), own=pytest.approx(1.6), steal=pytest.approx(0.4),
                                 interval_s=0.5)  # fmt: skip
    assert threads.oversubscription(2, 2, use) is None


def test_cpu_use_counts_other_processes_on_this_process_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 2}, raising=False)
    before = [_t(0, 0, 0), _t(0, 0, 0), _t(0, 0, 0), _t(0, 0, 0)]
    after = [_t(0.5, 0, 0), _t(0.45, 0.05, 0), _t(0.4, 0, 0.1), _t(0.5, 0, 0)]  # cores 0 and 3 are not ours
    _FakeClock(monkeypatch, [before, after], own=[(0.0, 0.0), (0.05, 0.0)])
    use = threads.cpu_use()
    assert (use.others, use.own, use.steal) == (pytest.approx(1.7), pytest.approx(0.1), 0.0)
    assert threads.oversubscription(2, 2, use) == (
        "the machine looks oversubscribed: over the last 0.5 s, other processes kept 1.7 of 2 cores busy (this "
        "process: 0.1, hypervisor steal: 0.0), + 2 torch threads here > 2 available cores; torch threads then wait "
        "on each other and a run can be many times slower. Stop the other jobs (ps, top), or give each process its "
        "own cores (taskset) and set run.num_threads accordingly."
    )


BUSY = "import time\nt = time.time() + 1.5\nwhile time.time() < t: pass"


@pytest.mark.slow  # a real measurement: another process, then a child process, spin on this machine for 1.5 s each
def test_another_busy_process_is_other_work_and_a_busy_thread_or_child_here_is_not():
    import subprocess
    import sys
    import threading

    # a busy process that is not a descendant (the shell exits at once, its background child is re-parented), as
    # another job on the machine would be
    subprocess.run(["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 &', BUSY], check=True)
    stop = time.monotonic() + 1.0
    spinner = threading.Thread(target=lambda: [None for _ in iter(lambda: time.monotonic() > stop, True)])
    try:
        time.sleep(0.2)
        spinner.start()
        use = threads.cpu_use(0.5)
    finally:
        spinner.join()
    assert use.others >= 0.25  # the other process (on a quiet machine about 1 core; others share the 2 cores)
    assert use.own >= 0.1  # the spinning thread of this process, counted as its own, not as other work
    time.sleep(1.5)  # the other process ends
    import psutil

    child = subprocess.Popen([sys.executable, "-c", BUSY])  # this process's own worker (the envs' grading pools)
    try:
        time.sleep(0.2)
        proc = psutil.Process(child.pid)
        t0 = sum(proc.cpu_times()[:2])
        use = threads.cpu_use(0.5)
        spent = sum(proc.cpu_times()[:2]) - t0  # the child's CPU seconds over (a little more than) the window
    finally:
        child.wait()
    # a busy child is this run's work, not another process's: its time is in ``own`` (whatever else loads the machine)
    assert spent > 0.05 and use.own >= 0.8 * spent / 0.5, (use, spent)


def test_check_runs_once_per_process(monkeypatch, restore_threads):
    calls = []
    monkeypatch.setattr(threads, "cpu_use", lambda: calls.append(1) or threads.CpuUse(0.0))
    threads.configure_threads(1)
    threads.configure_threads(1)
    assert calls == [1]
