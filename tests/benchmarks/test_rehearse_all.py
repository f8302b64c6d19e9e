"""benchmarks/perf/rehearse_all.py: the preset list is the paper's 40, and a rehearsal's verdict is condensed into
its row (pass / fail, stage seconds, memory); the real rehearsals run in tests/drmas_train/run/test_rehearsal.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers.scripts import load_script

bench = load_script("benchmarks/perf/rehearse_all.py")


def test_paper_presets_are_the_forty():
    presets = bench.paper_presets()
    assert len(presets) == 40 and sum(p.endswith("_dist") for p in presets) == 20


def test_a_verdict_becomes_a_row(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        workdir = Path(cmd[cmd.index("--dir") + 1])
        workdir.mkdir(parents=True)
        failed = "grpo" in cmd[cmd.index("--config") + 1]
        precision = {"shared": {"compute_dtype": "bfloat16", "trained_weights_dtype": "float32",
                                "update_rel": [None, 2e-5, 1e-5], "update_changed_frac": [None, 1.0, 0.9991]}}
        stages = [{"stage": "config", "ok": True, "seconds": 0.5},
                  {"stage": "train", "ok": not failed, "seconds": 9.0, "precision": precision,
                   **({"error": "RuntimeError: boom"} if failed else {})}]  # fmt: skip
        memory = {"driver_peak_rss_mb": 900.0, "rank_peak_rss_mb": {"shared": 700.0}}
        (workdir / "verdict.json").write_text(json.dumps({"ok": not failed, "stages": stages, "memory": memory}))  # fmt: skip
        return subprocess.CompletedProcess(cmd, 0 if not failed else 1, "", "")

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    ok = bench.rehearse_one("drmas_math_qwen3_4b_dist", tmp_path, "/venv/bin/python")
    assert ok["ok"] and ok["stages"] == {"config": 0.5, "train": 9.0} and ok["rank_peak_rss_mb"] == {"shared": 700.0}  # fmt: skip
    assert ok["precision"] == {"shared": {"compute_dtype": "bfloat16", "trained_weights_dtype": "float32",
                                          "min_changed_frac": 0.9991, "max_update_rel": 2e-5}}
    assert calls[0][-2:] == ["--vllm", "/venv/bin/python"]
    bad = bench.rehearse_one("grpo_math_qwen3_4b", tmp_path, None)
    assert not bad["ok"] and bad["error"] == "train: RuntimeError: boom" and "--vllm" not in calls[1]
    out = bench.main(["--presets", "drmas_math_qwen3_4b", "grpo_math_qwen3_4b", "--dir", str(tmp_path / "all"),
                      "--out", str(tmp_path / "out.json")])  # fmt: skip
    assert out["summary"]["run"] == 2 and out["summary"]["failed"] == ["grpo_math_qwen3_4b"]
    assert json.loads((tmp_path / "out.json").read_text())["presets"]["drmas_math_qwen3_4b"]["ok"] is True


def test_out_keeps_each_finished_preset(tmp_path, monkeypatch):
    """--out is rewritten after every preset: what an interrupted run measured is on disk, the rest is pending."""
    seen = []

    def fake_one(name, root, vllm):
        if seen:  # the second preset starts only after the first one's row was written
            written = json.loads((tmp_path / "out.json").read_text())
            assert list(written["presets"]) == seen and written["summary"]["pending"] == ["grpo_math_qwen3_4b"]
        seen.append(name)
        return {"ok": True, "wall_s": 1.0, "loadavg": [0.1, 0.2]}

    monkeypatch.setattr(bench, "rehearse_one", fake_one)
    out = bench.main(["--presets", "drmas_math_qwen3_4b", "grpo_math_qwen3_4b", "--dir", str(tmp_path / "all"),
                      "--out", str(tmp_path / "out.json")])  # fmt: skip
    assert seen == ["drmas_math_qwen3_4b", "grpo_math_qwen3_4b"]
    assert out["summary"]["pending"] == [] and out["summary"]["jobs"] == 1
    assert json.loads((tmp_path / "out.json").read_text())["summary"]["run"] == 2
