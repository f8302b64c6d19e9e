"""Per-role return and win/draw/loss statistics: golden numbers from hand-built episodes."""

from __future__ import annotations

import math
import re

import pytest

from drmas_envs.core import EpisodeRecord, Task
from drmas_envs.core.role_stats import outcome, role_outcomes, role_stats

# (game returns, learners): the learner in seat 0 twice, seat 1 twice (a fixed opponent fills the other seat)
EPISODES = [
    ({"player_0": 1.0, "player_1": -1.0}, ["player_0"]),
    ({"player_0": -2.0, "player_1": 2.0}, ["player_0"]),
    ({"player_0": 0.0, "player_1": 0.0}, ["player_1"]),
    ({"player_0": -1.0, "player_1": 1.0}, ["player_1"]),
]


def test_golden_per_role_statistics():
    stats = role_outcomes(EPISODES)
    assert list(stats) == ["player_0", "player_1", "all"]
    p0, p1, pooled = stats["player_0"], stats["player_1"], stats["all"]
    # player_0: returns 1, -2: mean -0.5, sample std sqrt(4.5), se sqrt(4.5/2) = 1.5
    assert (p0.episodes, p0.mean_return, p0.return_se) == (2, -0.5, 1.5)
    assert (p0.win_rate, p0.draw_rate, p0.loss_rate) == (0.5, 0.0, 0.5)
    assert (p0.win_se, p0.draw_se, p0.loss_se) == (0.5, 0.0, 0.5)  # 0/1 values 1, 0: std sqrt(0.5), se 0.5
    # player_1: returns 0, 1 -> one draw, one win
    assert (p1.mean_return, p1.return_se, p1.win_rate, p1.draw_rate, p1.loss_rate) == (0.5, 0.5, 0.5, 0.5, 0.0)
    # all: returns 1, -2, 0, 1: mean 0, sample var (1 + 4 + 0 + 1) / 3 = 2, se sqrt(2/4)
    assert pooled.episodes == 4 and pooled.mean_return == 0.0
    assert math.isclose(pooled.return_se, math.sqrt(0.5))
    assert (pooled.win_rate, pooled.draw_rate, pooled.loss_rate) == (0.5, 0.25, 0.25)
    assert pooled.to_dict()["role"] == "all"


def test_one_episode_has_no_standard_error_and_self_play_counts_every_seat():
    stats = role_outcomes([({"player_0": 1.0, "player_1": -1.0}, None)])
    assert stats["player_0"].win_rate == 1.0 and stats["player_1"].loss_rate == 1.0
    assert stats["player_0"].return_se is None and stats["all"].episodes == 2


def test_outcome_rules_and_errors():
    assert outcome("a", {"a": 1.0, "b": 1.0, "c": 0.0}) == "draw"  # tied for the best
    assert outcome("c", {"a": 1.0, "b": 1.0, "c": 0.0}) == "loss"
    with pytest.raises(ValueError, match=re.escape("agent 'x' has no reward; rewards are given for ['a', 'b']")):
        outcome("x", {"a": 1.0, "b": 0.0})
    with pytest.raises(ValueError, match=re.escape("win/draw/loss needs at least two agents, got only 'a'")):
        outcome("a", {"a": 1.0})
    with pytest.raises(ValueError, match=re.escape("episode 0 has no per-agent returns: not a game episode")):
        role_outcomes([({}, None)])
    with pytest.raises(ValueError, match=re.escape("no episodes to evaluate: give at least one")):
        role_outcomes([])


def _record(rewards, learners, opponent):
    return EpisodeRecord(
        task=Task("g-0", "openspiel/g", "rules", ""), agents=("player_0", "player_1"), calls=(),
        reward=rewards[learners[0]], won=False, metrics={"learners": learners, "opponent": opponent},
        agent_rewards=rewards,
    )  # fmt: skip


def test_role_stats_reads_records_and_refuses_mixed_opponents():
    records = [_record(r, ls, "random-v0") for r, ls in EPISODES]
    assert role_stats(records) == role_outcomes(EPISODES)
    with pytest.raises(ValueError, match=re.escape("the records mix opponents ['cfr-v0', 'random-v0']")):
        role_stats([*records, _record(*EPISODES[0], "cfr-v0")])
