"""Smoke test of benchmarks/perf/rollout_throughput.py on a tiny model: the JSON it prints is consistent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "perf" / "rollout_throughput.py"


@pytest.mark.slow
def test_throughput_benchmark_reports_consistent_counts():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "tiny-llama", "--tasks", "2", "--n", "3"]
        + ["--max-new-tokens", "4", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, never a measurement: ~37x the run's 24 s at load 6 on 2 cores
        check=True,
    )
    report = json.loads(out.stdout)
    lock, naive = report["lockstep"], report["naive"]
    # math-solver-verifier-v0 ends after Solver + Verifier here: 2 tasks x 3 rollouts x 2 calls, in 2 batched steps
    assert lock["agent_calls"] == naive["agent_calls"] == 12
    assert lock["generate_calls"] == 2 and naive["generate_calls"] == 12
    assert len(lock["wall_s_runs"]) == len(naive["wall_s_runs"]) == 2
    # the rate is 12 / the unrounded wall time, both printed to 3 decimals: within those roundings, at any speed
    # (a relative tolerance would fail on a machine fast enough to make the 3-decimal wall_s coarse)
    wall = lock["wall_s"]
    assert 12 / (wall + 5e-4) - 5e-4 <= lock["agent_calls_per_s"] <= 12 / max(wall - 5e-4, 1e-9) + 5e-4
    c_lock, c_naive = lock["backend_counters"], naive["backend_counters"]
    assert c_lock["generated_tokens"] == lock["generated_tokens"] <= 12 * 4
    # alone, a prompt is prefilled exactly; batched, the 3 equal openings of a task and shared prefixes are not
    assert c_naive["prefill_tokens"] == c_naive["prompt_tokens"] and c_naive["prefill_forwards"] == 12
    assert c_lock["prefill_tokens"] < c_lock["prompt_tokens"]
    assert report["speedup_agent_calls_per_s"] == round(
        lock["agent_calls_per_s"] / naive["agent_calls_per_s"], 2
    )
