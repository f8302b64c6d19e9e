"""benchmarks/games/quickstart_runs.py: per-run validations, reply validity and the gain over runs, from run files."""

from __future__ import annotations

import json
import math
from pathlib import Path

from helpers.scripts import load_script


def _script():
    return load_script("benchmarks/games/quickstart_runs.py", "games_quickstart_runs")


def _fake_run(path: Path, seed: int, gain: float, replies: list[tuple[str, bool]]) -> None:
    path.mkdir()
    (path / "config.yaml").write_text(f"seed: {seed}\nrun:\n  iterations: 1\n")
    validation = {"0": {"val/random-v0/all/return": -0.02, "val/random-v0/all/return_se": 0.1},
                  "1": {"val/random-v0/all/return": -0.02 + gain, "val/random-v0/all/return_se": 0.1,
                        "val/random-v0/return_gain": gain, "val/random-v0/return_gain_se": 0.05}}  # fmt: skip
    (path / "summary.json").write_text(json.dumps({"validation": validation, "wall_time_s": 12.34}))
    (path / "samples").mkdir()
    rows = [{"response_text": text, "is_action_valid": valid} for text, valid in replies]
    (path / "samples" / "iter_000001.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def test_records_gains_validity_and_the_spread_over_runs(tmp_path, capsys):
    module = _script()
    _fake_run(tmp_path / "a", 0, 0.1, [("<action>Pass</action>", True), ("<action>Pass</action>", True), ("hi", False)])
    _fake_run(tmp_path / "b", 1, -0.3, [("x", False)])
    out = tmp_path / "runs.json"
    assert module.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    a = result["runs"][str(tmp_path / "a")]
    assert a["seed"] == 0 and a["wall_time_s"] == 12.3
    assert a["validations"]["1"] == {"return": -0.02 + 0.1, "return_se": 0.1, "gain": 0.1, "gain_se": 0.05}
    assert "gain" not in a["validations"]["0"]
    assert a["replies"]["1"] == {"calls": 3, "valid": 2, "top_reply": "<action>Pass</action>", "top_count": 2}
    assert result["final_gain_per_run"] == [0.1, -0.3]
    assert math.isclose(result["final_gain_mean"], -0.1)
    assert math.isclose(result["final_gain_se_over_runs"], math.sqrt(0.08) / math.sqrt(2))  # stdev of (0.1, -0.3)
    assert json.loads(capsys.readouterr().out) == result
