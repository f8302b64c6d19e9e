"""Per-role game metrics as flat names (golden values from a hand-built set of returns) and the paired gain."""

from __future__ import annotations

import math
import re

import pytest

from drmas_envs.core import Task
from drmas_envs.core.episode import EpisodeRecord
from drmas_train.eval.game_metrics import (
    episode_returns,
    paired_gain,
    role_metrics,
    role_return_gain,
    stats_line,
)


def _record(r0: float, r1: float, learners: list[str] | None) -> EpisodeRecord:
    return EpisodeRecord(TASK, ("player_0", "player_1"), (), reward=r0, won=r0 > r1,
                         agent_rewards={"player_0": r0, "player_1": r1},
                         metrics={"learners": learners} if learners else {})  # fmt: skip


TASK = Task("kuhn_poker-0", "openspiel/kuhn_poker", "rules", "")


#: a learner against a fixed opponent: seat 0 wins +2, loses -1, draws 0; seat 1 wins +1 twice
RECORDS = [_record(2.0, -2.0, ["player_0"]), _record(-1.0, 1.0, ["player_0"]), _record(0.0, 0.0, ["player_0"]),
           _record(-1.0, 1.0, ["player_1"]), _record(-1.0, 1.0, ["player_1"])]  # fmt: skip


def test_role_metrics_golden():
    m = role_metrics(RECORDS, "val/random-v0")
    # seat 0: returns 2, -1, 0 -> mean 1/3, sample var ((5/3)^2 + (4/3)^2 + (1/3)^2) / 2 = 7/3, SE sqrt(7/9)
    assert m["val/random-v0/player_0/episodes"] == 3.0
    assert m["val/random-v0/player_0/return"] == pytest.approx(1 / 3)
    assert m["val/random-v0/player_0/return_se"] == pytest.approx(math.sqrt(7 / 9))
    assert (m["val/random-v0/player_0/win"], m["val/random-v0/player_0/draw"], m["val/random-v0/player_0/loss"]) == \
        pytest.approx((1 / 3, 1 / 3, 1 / 3))
    # one 1 among three 0/1 indicators: sample var 1/3, SE sqrt(1/9)
    assert m["val/random-v0/player_0/win_se"] == pytest.approx(1 / 3)
    # seat 1: +1 twice, always a win: SEs 0
    assert (m["val/random-v0/player_1/return"], m["val/random-v0/player_1/return_se"]) == (1.0, 0.0)
    assert (m["val/random-v0/player_1/win"], m["val/random-v0/player_1/win_se"]) == (1.0, 0.0)
    # pooled: returns 2, -1, 0, 1, 1 -> mean 0.6; wins 3 of 5, one draw, one loss
    assert m["val/random-v0/all/episodes"] == 5.0
    assert m["val/random-v0/all/return"] == pytest.approx(0.6)
    assert m["val/random-v0/all/return_se"] == pytest.approx(math.sqrt((1.96 + 2.56 + 0.36 + 0.16 + 0.16) / 4 / 5))
    assert (m["val/random-v0/all/win"], m["val/random-v0/all/draw"], m["val/random-v0/all/loss"]) == \
        pytest.approx((0.6, 0.2, 0.2))
    assert m["val/random-v0/all/win_se"] == pytest.approx(math.sqrt(0.3 / 5))  # var of 3 ones in 5: 0.3
    assert stats_line(m, "val/random-v0", "player_1") == (
        "return +1.00 ± 0.00, win 100.0% ± 0.0%, draw 0.0% ± 0.0%, loss 0.0% ± 0.0%")


def test_role_metrics_leaves_out_the_se_of_a_single_episode_and_refuses_non_games():
    m = role_metrics(RECORDS[:1], "game")
    assert m["game/player_0/return"] == 2.0 and "game/player_0/return_se" not in m
    assert role_metrics([], "game") == {}
    plain = EpisodeRecord(TASK, ("solver",), (), reward=1.0, won=True)
    with pytest.raises(ValueError, match=re.escape(
            "episode 0 has no per-seat returns (EpisodeRecord.agent_rewards): not a game episode")):  # fmt: skip
        role_metrics([plain], "game")


def test_self_play_episode_return_is_the_mean_over_its_learning_seats():
    assert episode_returns(RECORDS) == [2.0, -1.0, 0.0, 1.0, 1.0]
    assert episode_returns([_record(2.0, -2.0, None)]) == [0.0]  # both seats learn: zero-sum cancels


def test_paired_gain_golden_and_errors():
    value, se = paired_gain([1.0, 2.0, -1.0, 0.0], [0.0, 2.0, -2.0, -2.0])  # differences 1, 0, 1, 2
    assert value == pytest.approx(1.0)
    assert se == pytest.approx(math.sqrt((0 + 1 + 0 + 1) / 3 / 4))
    assert paired_gain([1.0], [0.0]) == (1.0, None)
    with pytest.raises(ValueError, match=re.escape("paired gain needs the same episodes: 2 now vs 1 before")):
        paired_gain([1.0, 2.0], [0.0])


def test_role_return_gain_weighs_the_roles_equally():
    before = {"val/r/player_0/return": 0.5, "val/r/player_1/return": -0.5, "val/r/all/return": 0.0,
              "val/r/player_0/return_se": 0.1, "val/r/player_2/return": 1.0, "val/s/player_0/return": 9.0}  # fmt: skip
    after = {"val/r/player_0/return": 1.0, "val/r/player_1/return": 0.25, "val/r/all/return": 0.625}
    out = role_return_gain(before, after, "val/r")
    assert out == {"gain": pytest.approx((0.5 + 0.75) / 2), "roles": {"player_0": 0.5, "player_1": 0.75}}
    with pytest.raises(ValueError, match="no role has a return"):
        role_return_gain(before, after, "val/cfr-v0")
