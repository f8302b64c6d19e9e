"""A game's episodes flow through `drmas eval` and `drmas leaderboard`: per-seat returns in the rows, per-role
return and win/draw/loss rates in the metrics cell."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pyspiel")

from drmas_envs.core.role_stats import role_outcomes  # noqa: E402
from drmas_train.commands import eval as eval_cmd  # noqa: E402
from drmas_train.commands import leaderboard as lb_cmd  # noqa: E402
from drmas_train.eval.leaderboard import suite_of  # noqa: E402
from drmas_train.eval.metrics import summarize_episodes  # noqa: E402

KUHN = "openspiel/kuhn_poker-v0"


def test_cli_eval_of_a_game_against_a_fixed_opponent(tmp_path, capsys):
    out = tmp_path / "runs" / "random"
    argv = ["--env", KUHN, "--policy", "random", "--k", "16", "--env-kwarg", "opponent=cfr-v0", "--no-progress"]
    assert eval_cmd.main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "  openspiel/kuhn_poker-v0 role all (n=16): return " in printed and ", loss " in printed
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 16 and all(row["opponent"] == "cfr-v0" and len(row["learners"]) == 1 for row in rows)
    for row in rows:
        (learner,) = row["learners"]
        other = next(a for a in row["agent_rewards"] if a != learner)
        assert row["agent_rewards"][learner] == -row["agent_rewards"][other] == row["reward"]  # zero-sum
        # random text: every call of the learner is invalid, 0.1 each
        assert row["returns"][learner] == pytest.approx(row["reward"] - 0.1 * row["calls"][learner])
        assert row["invalid_actions"][learner] == row["calls"][learner] >= 1
        assert row["returns"][other] == row["agent_rewards"][other]  # the opponent pays no penalty
    cell = json.loads((out / "summary.json").read_text())["metrics"][KUHN]["overall"]
    expected = role_outcomes((row["agent_rewards"], row["learners"]) for row in rows)
    assert cell["roles"] == {role: stats.to_dict() for role, stats in expected.items()}
    assert cell["roles"]["all"]["episodes"] == 16
    assert cell["roles"]["player_0"]["episodes"] + cell["roles"]["player_1"]["episodes"] == 16
    assert suite_of("openspiel/kuhn_poker", KUHN) == "openspiel-other"  # a suite names files: no '/'
    assert lb_cmd.main([str(out.parent), "--out", str(tmp_path / "lb")]) == 0
    assert "## openspiel-other" in (tmp_path / "lb" / "leaderboard.md").read_text()


def test_rows_without_per_agent_rewards_have_no_roles():
    row = {"env_id": "e", "data_source": "d", "task_id": "t", "won": True, "reward": 1.0}
    assert "roles" not in summarize_episodes([row])["e"]["overall"]


def test_oracle_refuses_a_game_in_one_line(tmp_path, capsys):
    assert eval_cmd.main(["--env", KUHN, "--k", "1", "--no-progress", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == (
        "drmas eval: baseline 'oracle' plays a task's ground truth, and game env 'openspiel_kuhn_poker_v0' has none; "
        "use --policy random (the env then plays a random legal move for each invalid reply) or --policy llm\n"
    )


def test_eval_with_the_game_quickstart_preset_plays_its_opponent_and_rotates_seats(tmp_path, capsys):
    out = tmp_path / "kuhn"
    argv = ["--preset", "quickstart_kuhn", "--policy", "random", "--k", "8", "--no-progress", "--out", str(out)]
    assert eval_cmd.main(argv) == 0
    err = capsys.readouterr().err
    assert ("drmas eval: a game: its one task, --k hands (the run validated on 128 hands against each of random-v0; "
            "--env-kwarg opponent=NAME picks this evaluation's)") in err
    rows = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {row["opponent"] for row in rows} == {"random-v0"}
    assert [row["learners"] for row in rows] == [["player_0"], ["player_1"]] * 4  # opponent_seat: rotate
