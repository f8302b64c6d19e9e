"""Host memory of a training rank (drmas_train.distributed.host_memory): glibc's mmap threshold is fixed unless the
environment sets it, and freed blocks then leave the process instead of staying in the heap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from drmas_train.distributed import host_memory
from drmas_train.distributed.host_memory import (
    cap_mmap_threshold,
    env_sets_mmap_threshold,
    peak_rss_mb,
    rss_mb,
)

GLIBC = host_memory._glibc() is not None


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, True),
        ({"MALLOC_MMAP_THRESHOLD_": "  "}, False),  # empty: glibc ignores it
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1:glibc.malloc.mmap_threshold=2"}, True),
        ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}, False),
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"}, False),
        ({"GLIBC_TUNABLES": "xglibc.malloc.mmap_threshold=1"}, False),  # not the tunable's name
        ({"OTHER": "glibc.malloc.mmap_threshold=1"}, False),
    ],
)
def test_env_sets_mmap_threshold(environ, expected):
    assert env_sets_mmap_threshold(environ) is expected


@pytest.mark.parametrize("nbytes", [-1, 32 * 1024 * 1024 + 1, 2**40])
def test_cap_refuses_sizes_glibc_refuses(nbytes):
    with pytest.raises(ValueError, match=r"mmap threshold must be in \[0, 33554432\] bytes"):
        cap_mmap_threshold(nbytes, environ={})


def test_cap_leaves_the_threshold_to_the_environment_or_zero():
    assert cap_mmap_threshold(environ={"MALLOC_MMAP_THRESHOLD_": "1048576"}) is False
    assert cap_mmap_threshold(environ={"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"}) is False
    assert cap_mmap_threshold(0, environ={}) is False


def test_rss_is_positive_and_within_the_peak():
    now, peak = rss_mb(), peak_rss_mb()
    assert 0 < now <= peak + 1.0  # the peak is sampled by the kernel, in whole KiB


# 20 rounds of 8 blocks of 8 MiB (64 MiB), each followed by a small block that stays alive: it pins the heap so
# that glibc cannot return a freed stretch by shrinking the heap's top; then the RSS in MiB over the start's.
_LOOP = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from drmas_train.distributed.host_memory import cap_mmap_threshold, release_freed_memory, rss_mb
    capped = False
    if sys.argv[1] == "cap":
        capped = cap_mmap_threshold(environ={})
    base, keep = rss_mb(), []
    for _ in range(20):
        blocks = []
        for _ in range(8):
            blocks.append(np.ones(2**20))  # 8 MiB of float64
            keep.append(np.ones(512))  # 4 KiB, alive to the end
        del blocks
    held = rss_mb() - base
    release_freed_memory()
    print(json.dumps({"capped": capped, "held": held, "after_release": rss_mb() - base}))
    """
)


def _run_loop(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    env["OMP_NUM_THREADS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _LOOP, mode], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the mmap threshold is glibc's")
def test_capped_threshold_returns_freed_blocks_to_the_os():
    capped = _run_loop("cap")
    assert capped["capped"] is True
    assert capped["held"] < 16.0  # MiB: freed 8 MiB blocks were unmapped (the live small blocks are 640 KiB)
    # the control: glibc's dynamic threshold rises to 8 MiB after the first free, later blocks come from the heap
    # and, pinned, stay resident after free until malloc_trim (release_freed_memory) hands their pages back
    dynamic = _run_loop("nocap")
    assert dynamic["capped"] is False
    assert dynamic["held"] > 32.0
    assert dynamic["after_release"] < 16.0


# a training rank's process: the TrainWorker constructor (host_memory from argv), then its release after a call,
# with glibc's mallopt and malloc_trim recorded
_TRAIN_WORKER = textwrap.dedent(
    """
    import json, sys
    from drmas_train.distributed import host_memory
    from drmas_train.distributed.workers import TrainWorker
    from drmas_train.model.models import ModelSpec

    libc, calls = host_memory._glibc(), []
    mallopt, trim = libc.mallopt, libc.malloc_trim
    libc.mallopt = lambda *args: calls.append(list(args)) or mallopt(*args)
    libc.malloc_trim = lambda *args: calls.append(["trim"]) or trim(*args)
    worker = TrainWorker(ModelSpec("tiny-llama"), "m", 0, 1, host_memory=sys.argv[1])
    worker._release()
    print(json.dumps(calls))
    """
)


@pytest.mark.slow  # ~16-23 s each on 2 loaded cores: imports torch, transformers and ray
@pytest.mark.skipif(not GLIBC, reason="the mmap threshold is glibc's")
@pytest.mark.parametrize(
    ("env_vars", "host_memory", "calls"),
    [
        ({}, "release", [[-3, 128 * 1024], ["trim"]]),  # M_MMAP_THRESHOLD fixed at glibc's initial 128 KiB
        ({"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}, "release", [["trim"]]),  # the user's threshold is left alone
        ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1048576"}, "release", [["trim"]]),
        ({}, "keep", []),  # distributed.rank_host_memory=keep: glibc's defaults, nothing released
    ],
)
def test_a_training_rank_caps_the_threshold_unless_the_environment_sets_it(env_vars, host_memory, calls):
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    env.update(OMP_NUM_THREADS="1", **env_vars)
    out = subprocess.run(
        [sys.executable, "-c", _TRAIN_WORKER, host_memory], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == calls


def test_a_training_rank_refuses_an_unknown_host_memory():
    from drmas_train.distributed.workers import TrainWorker
    from drmas_train.model.models import ModelSpec

    with pytest.raises(ValueError, match="host_memory must be 'release' or 'keep', got 'lean'"):
        TrainWorker(ModelSpec("tiny-llama"), "m", 0, 1, host_memory="lean")
