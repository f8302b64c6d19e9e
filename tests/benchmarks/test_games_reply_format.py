"""benchmarks/games/reply_format.py runs on a tiny model and reports each candidate prompt's valid-reply share."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspiel")

from helpers.scripts import load_script  # noqa: E402


@pytest.mark.slow  # a tiny model, 2 hands x 2 prompts: 34 s measured at load average ~25 on 2 cores
def test_reply_format_smoke(capsys, tmp_path):
    bench = load_script("benchmarks/games/reply_format.py", "games_reply_format_bench")
    out_file = tmp_path / "out.json"
    argv = ["--model", "tiny-llama", "--hands", "2", "--temperatures", "0.7", "--max-new-tokens", "4",
            "--only", "default,quickstart_kuhn", "--out", str(out_file)]  # fmt: skip
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(out_file.read_text())
    assert set(out["candidates"]) == {"default@0.7", "quickstart_kuhn@0.7"}
    for row in out["candidates"].values():
        assert 0.0 <= row["valid"] <= 1.0 and row["valid"] == pytest.approx(row["pass"] + row["bet"])
