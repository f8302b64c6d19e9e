"""benchmarks/games/env_speed.py runs and reports every (id, opponent) pair it plays."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspiel")

from helpers.scripts import load_script  # noqa: E402


@pytest.mark.slow  # solves Leduc poker with CFR+ (~1 s)
def test_env_speed_smoke(capsys):
    bench = load_script("benchmarks/games/env_speed.py", "games_env_speed_bench")
    assert bench.main(["--episodes", "2", "--ids", "openspiel/kuhn_poker-v0", "openspiel/tic_tac_toe-v0"]) == 0
    out = json.loads(capsys.readouterr().out)
    pairs = [(r["env_id"], r["opponent"]) for r in out["rows"]]
    assert pairs == [
        ("openspiel/kuhn_poker-v0", None), ("openspiel/kuhn_poker-v0", "random-v0"),
        ("openspiel/kuhn_poker-v0", "cfr-v0"), ("openspiel/tic_tac_toe-v0", None),
        ("openspiel/tic_tac_toe-v0", "random-v0"), ("openspiel/tic_tac_toe-v0", "mcts-v0"),
    ]  # fmt: skip
    assert all(r["episodes"] == 2 and r["calls_per_episode"] >= 1 for r in out["rows"])
    assert set(out["cfr_solve_s"]) == {"kuhn_poker", "leduc_poker"}
