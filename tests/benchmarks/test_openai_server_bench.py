"""Smoke test of benchmarks/perf/openai_server.py on a tiny model: the counts it prints are consistent.

Wall times are measurements, never asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "perf" / "openai_server.py"


@pytest.mark.slow
def test_openai_server_benchmark_reports_consistent_counts():
    # timeout: a hang guard, never a measurement (~10 s at load 2, 121 s at load 15 on 2 cores)
    out = subprocess.run([sys.executable, str(SCRIPT), "--requests", "3", "--max-tokens", "4", "--repeats", "1"],
                         capture_output=True, text=True, timeout=1200, check=True)  # fmt: skip
    report = json.loads(out.stdout)
    serial, together = report["serial"], report["concurrent"]
    assert serial["backend_calls_runs"] == [3]  # one call per request when each waits for the previous reply
    assert 1 <= together["backend_calls_runs"][0] <= 3
    assert all(0 < n <= 3 * 4 for n in serial["completion_tokens_runs"] + together["completion_tokens_runs"])
    assert len(serial["wall_s_runs"]) == len(together["wall_s_runs"]) == 1
    assert report["speedup_concurrent_vs_serial"] == round(serial["wall_s"] / together["wall_s"], 2)
