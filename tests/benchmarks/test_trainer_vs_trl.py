"""Smoke test of benchmarks/perf/trainer_vs_trl.py as a user runs it (tiny model, one step per side)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "perf" / "trainer_vs_trl.py"


@pytest.mark.slow
def test_trainer_vs_trl_runs_both_sides_on_the_same_tokens(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "PYTHONPATH": str(SCRIPT.parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", "")}  # fmt: skip
    # timeout: a hang guard, never a measurement: ~27x the run's 131 s at load 6 on 2 cores
    subprocess.run([sys.executable, str(SCRIPT), "--model", "tiny-llama", "--max-new-tokens", "8", "--batch", "2",
                    "--steps", "1", "--sides", "drmas,trl", "--modes", "nonzero", "--micro-batch-tokens", "256,4096",
                    "--data", "reasoning_gym:gsm_symbolic", "--out", str(out)],
                   env=env, check=True, capture_output=True, timeout=3600)  # fmt: skip
    result = json.loads(out.read_text())
    sides = result["sides"]
    assert set(sides) == {"drmas@256/nonzero", "drmas@4096/nonzero", "trl/nonzero"}
    tokens = {k: v["tokens_per_step"] for k, v in sides.items()}
    assert len({tuple(t) for t in tokens.values()}) == 1 and tokens["trl/nonzero"][0] > 0  # the same sequences
    for v in sides.values():
        assert v["tokens_per_s"] > 0 and v["tokens_per_cpu_s"] > 0 and v["peak_rss_gb"] > 0.1
    ratio = result["ratios"]["drmas@256_vs_trl/nonzero"]
    assert ratio["tokens_per_s"] == pytest.approx(sides["drmas@256/nonzero"]["tokens_per_s"] / sides["trl/nonzero"]["tokens_per_s"], rel=0.01)
