"""Smoke test of benchmarks/perf/time_bounds.py: every bounded call it times ends with its limit's error.

Only outcomes and counts are checked; the seconds it prints are measurements, never asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "perf" / "time_bounds.py"


@pytest.mark.slow
def test_time_bounds_benchmark_reports_each_bounded_call():
    # timeout: a hang guard, never a measurement (~5 s at load 5, 20 s at load 15 on 2 cores)
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1", "--skip", "grader"],
                         capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    report = json.loads(out.stdout)
    http = report["http_retriever"]
    for case in ("silent_server", "endless_trickle", "refused_port_4_attempts"):
        assert http[case]["outcomes"] == ["RetrieverUnavailableError"] and len(http[case]["seconds"]) == 1
    assert http["silent_server"]["connections_per_call"] <= 1 and http["silent_server"]["limit_s"] == 1.0
    (outcome,) = report["openai_backend"]["outcomes"]
    assert outcome.endswith("Timeout")  # one of httpx's timeouts (ReadTimeout: the handler never answers)
    assert {k: v["reason"] for k, v in report["grader_long_inputs"].items()} == {
        "1MB_box": "too_long", "1MB_no_box": "no_box", "1MB_open_nesting": "too_long"}  # fmt: skip
    assert set(report["tag_parsing"]) == {
        "openers",
        "brackets",
        "long_content",
        "padded_opener",
        "many_pairs",
    }
    assert "grader" not in report and report["machine"]["cpus"] >= 1
