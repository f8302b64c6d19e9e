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


@pytest.mark.slow  # a tiny model, 4 games of each pilot preset: ~20 s on 2 cores
def test_reply_format_presets(capsys):
    """--presets measures each game preset's own prompt: valid share = the sum of its legal moves' shares."""
    import pyspiel

    import drmas_envs
    from drmas_train.run.config import load_config

    bench = load_script("benchmarks/games/reply_format.py", "games_reply_format_bench")
    presets = ["quickstart_game_tic_tac_toe", "quickstart_game_connect_four"]
    argv = ["--model", "tiny-llama", "--hands", "4", "--temperatures", "0.7", "--max-new-tokens", "8",
            "--presets", ",".join(presets)]  # fmt: skip
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["candidates"]) == {f"{p}@0.7" for p in presets}
    for preset in presets:
        row = out["candidates"][f"{preset}@0.7"]
        cfg = load_config(preset)
        assert row["env_id"] == cfg.env.id
        assert row["valid"] == pytest.approx(sum(row["moves"].values()))
        game = pyspiel.load_game(drmas_envs.make(cfg.env.id).unwrapped.GAME)
        state = game.new_initial_state()
        names = {state.action_to_string(p, a) for p in range(2) for a in range(game.num_distinct_actions())}
        assert set(row["moves"]) <= names


def test_reply_format_presets_refuses_a_non_game():
    import argparse

    from drmas_train.run.config import ConfigError

    bench = load_script("benchmarks/games/reply_format.py", "games_reply_format_bench")
    args = argparse.Namespace(hands=1, temperatures="0.7", max_new_tokens=4)
    with pytest.raises(ConfigError, match="not a game"):
        bench._preset_rows(None, "quickstart_math", args)  # before any model call
