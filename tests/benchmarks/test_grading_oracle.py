"""benchmarks/grading_oracle.py on the real GSM8K / MATH-500 files (every 5th problem; the full run is the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.shared_data import shared_file

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grading_oracle.py"


@pytest.mark.slow
@pytest.mark.shared_data
def test_oracle_scores_one_and_wrong_scores_zero():
    data_dir = shared_file("gsm8k_test.jsonl").parent
    shared_file("math500_test.jsonl")
    # a generous limit (60 s, 200x the slowest verifications measured, p99 <= 0.3 s): CI machines are shared, and
    # this test checks correctness, not speed
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--data-dir", str(data_dir), "--stride", "5", "--timeout-s", "60"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    for name, expected in (("gsm8k", 264), ("math500", 100)):
        d = report["datasets"][name]
        assert d["problems"] == expected
        assert d["oracle_scored_1"] == expected
        assert d["wrong_scored_0"] == expected and d["wrong_scored_1"] == []
        assert d["math_verify_self_check_correct"] == expected, d["math_verify_self_check_failures"]
