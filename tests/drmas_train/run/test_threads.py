"""Default torch threads from the available cores; one warning when the machine is oversubscribed."""

from __future__ import annotations

import logging
import os

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


def test_busy_cores_counts_only_this_process_cores_now(monkeypatch):
    import psutil

    seen = {}

    def cpu_percent(interval=None, percpu=False):
        seen.update(interval=interval, percpu=percpu)
        return [100.0, 50.0, 80.0, 0.0]

    monkeypatch.setattr(psutil, "cpu_percent", cpu_percent)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 2}, raising=False)
    assert threads.busy_cores() == pytest.approx(1.3)  # cores 1 and 2: 0.5 + 0.8 busy, measured over an interval
    assert seen == {"interval": 0.25, "percpu": True}


def test_check_runs_once_per_process(monkeypatch, restore_threads):
    calls = []
    monkeypatch.setattr(threads, "busy_cores", lambda: calls.append(1) or 0.0)
    threads.configure_threads(1)
    threads.configure_threads(1)
    assert calls == [1]
