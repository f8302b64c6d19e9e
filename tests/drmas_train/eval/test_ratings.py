"""Ratings from cross-play games (openskill Plackett-Luce): ranking, per-player results, the grid's matches, and
the leaderboard section."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("openskill")

from drmas_train.eval.ratings import Match, crossplay_matches, rate_matches, ratings_markdown  # noqa: E402


def _matches():
    # strong beats everyone (+1), weak loses to everyone, mid and mid2 draw each other; 4 rounds, fixed order
    out = []
    for _ in range(4):
        out += [Match("strong", "weak", "win", 1.0, -1.0), Match("mid", "strong", "loss", -2.0, 2.0),
                Match("weak", "mid", "loss", -1.0, 1.0), Match("mid", "mid2", "draw", 0.0, 0.0),
                Match("strong", "strong", "win", 1.0, -1.0)]  # a self-match: skipped  # fmt: skip
    return out


def test_a_player_that_always_wins_ranks_above_one_that_always_loses():
    ratings = rate_matches(_matches())
    by = {r.player: r for r in ratings}
    assert ratings[0].player == "strong" and ratings[-1].player == "weak"
    assert [r.rank for r in ratings] == [1, 2, 3, 4]
    assert by["strong"].ordinal > by["mid"].ordinal > by["weak"].ordinal
    assert by["strong"].mu > 25.0 > by["weak"].mu  # openskill's start: mu 25, sigma 25/3
    assert all(r.sigma < 25 / 3 for r in ratings)
    # per-player results over their own matches (self-matches excluded)
    assert (by["strong"].matches, by["strong"].win, by["strong"].loss, by["strong"].mean_return) == (8, 1.0, 0.0, 1.5)
    # returns +1 x4 (vs weak) and +2 x4 (vs mid): sample std sqrt(8 * 0.25 / 7), over sqrt(8)
    assert by["strong"].win_se == 0.0 and by["strong"].return_se == pytest.approx((2 / 7) ** 0.5 / 8**0.5)
    assert (by["weak"].matches, by["weak"].win, by["weak"].loss, by["weak"].mean_return) == (8, 0.0, 1.0, -1.0)
    assert (by["mid"].matches, by["mid"].win, by["mid"].draw, by["mid"].loss) == (12, 1 / 3, 1 / 3, 1 / 3)
    # rates' SE: std(ddof=1) / sqrt(n) of the 0/1 indicators: 4 ones in 12 -> sqrt(12/11 * 2/9) / sqrt(12)
    assert by["mid"].win_se == pytest.approx((4 * (2 / 3) ** 2 + 8 * (1 / 3) ** 2) ** 0.5 / 11**0.5 / 12**0.5)
    assert rate_matches(_matches()) == ratings  # the same order, the same ratings


def test_bad_result_is_a_clear_error():
    with pytest.raises(ValueError, match=re.escape("match result must be one of ['draw', 'loss', 'win'], got 'tie'")):
        rate_matches([Match("a", "b", "tie", 0.0, 0.0)])


def _matrix(shared: bool):
    def player(label, it, role):
        model = f"run/iter_{it}/shared" if shared else f"run/iter_{it}/{role}_model"
        return {"label": label, "model": model, "info": {"model_of": role}}

    return {"roles": {"rows": "player_0", "cols": "player_1"},
            "rows": [player("base", 0, "player_0"), player("iter 2", 2, "player_0")],
            "cols": [player("base", 0, "player_1"), player("iter 2", 2, "player_1")]}  # fmt: skip


def _row(r0, r1):
    return {"agent_rewards": {"player_0": r0, "player_1": r1}, "learners": ["player_0", "player_1"]}


def test_crossplay_matches_one_player_per_model_in_both_seats():
    episodes = [[[_row(1.0, -1.0)], [_row(-2.0, 2.0), _row(1.0, -1.0)]],
                [[_row(2.0, -2.0)], [_row(0.0, 0.0)]]]  # fmt: skip
    shared = crossplay_matches(_matrix(shared=True), episodes)
    assert [(m.a, m.b, m.result, m.return_a, m.return_b) for m in shared] == [  # hand 1 of every cell, then hand 2
        ("base", "base", "win", 1.0, -1.0), ("base", "iter 2", "loss", -2.0, 2.0), ("iter 2", "base", "win", 2.0, -2.0),
        ("iter 2", "iter 2", "draw", 0.0, 0.0), ("base", "iter 2", "win", 1.0, -1.0)]  # fmt: skip
    assert {r.player for r in rate_matches(shared)} == {"base", "iter 2"}  # self-matches (the diagonal) skipped
    separate = crossplay_matches(_matrix(shared=False), episodes)  # one model per seat: four players
    assert {m.a for m in separate} == {"base (player_0's model)", "iter 2 (player_0's model)"}
    assert {m.b for m in separate} == {"base (player_1's model)", "iter 2 (player_1's model)"}
    vs_opponent = [[[{"agent_rewards": {"player_0": 1.0, "player_1": -1.0}, "learners": ["player_0"]}]]]
    assert crossplay_matches({**_matrix(True), "rows": _matrix(True)["rows"][:1], "cols": _matrix(True)["cols"][:1]},
                             vs_opponent) == []  # a fixed opponent played a seat: no head-to-head match  # fmt: skip
    no_game = [[[{"won": True}]]]
    assert crossplay_matches({**_matrix(True), "rows": _matrix(True)["rows"][:1], "cols": _matrix(True)["cols"][:1]},
                             no_game) == []  # fmt: skip


def test_leaderboard_shows_the_ratings_next_to_the_win_rate(tmp_path):
    from drmas_train.eval.leaderboard import write_leaderboard
    from drmas_train.eval.results import load_run, write_run
    from helpers.eval_rows import make_episodes, make_summary

    ratings = rate_matches(_matches())
    text = ratings_markdown(ratings)
    assert text.splitlines()[2] == "| Rank | Player | Rating (μ − 3σ) | μ ± σ | Games | Win % (avg@k) | Draw % | Loss % | Return |"
    assert text.splitlines()[4].startswith(f"| 1 | strong | {ratings[0].ordinal:.2f} | {ratings[0].mu:.2f} ± ")
    assert "| 8 | 100.0 ± 0.0 | 0.0 ± 0.0 | 0.0 ± 0.0 | +1.500 ± " in text.splitlines()[4]
    rows = make_episodes()
    run = load_run(write_run(tmp_path / "runs" / "a", make_summary(rows, 2), rows))
    written = write_leaderboard([run], tmp_path / "lb", png=False, ratings=ratings)
    assert written["markdown"].read_text().endswith(text)
    assert "<h2>Ratings from cross-play</h2>" in written["html"].read_text()
    assert json.loads(written["ratings"].read_text())[0]["player"] == "strong"
