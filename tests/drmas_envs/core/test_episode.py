"""The episode record (drmas_envs.core.episode): what the env exposes once an episode is over."""

from __future__ import annotations

import json
import re

import pytest

import drmas_envs
from drmas_envs.core import CallRecord, EpisodeRecord, episode_record
from helpers.echo_env import EchoEnv


def _played(actions, task_index=3, format_penalty=0.1):
    env = EchoEnv(format_penalty=format_penalty)
    env.reset(seed=0, options={"task_index": task_index})
    for action in actions:
        env.step(action)
    return env


def test_record_of_a_finished_episode_has_calls_prompts_scores_and_outcome():
    env = _played(["hello", "ok 3"])
    ep = env.episode_record()
    assert (ep.task_id, ep.data_source, ep.ground_truth, ep.task.question) == ("t3", "echo", ("3",), "say 3")
    assert (ep.reward, ep.won, ep.truncated, ep.num_turns, ep.traj_uid) == (1.0, True, False, 2, None)
    assert ep.metrics == {"answer": "ok 3"} and ep.agents == ("a", "b")
    assert ep.returns == pytest.approx({"a": 0.9, "b": 1.0})
    a, b = ep.calls
    assert (a.agent_id, a.turn, a.agent_turn, a.text, a.valid, a.penalty) == ("a", 0, 0, "hello", False, 0.1)
    assert a.score == pytest.approx(0.9) and b.score == 1.0 and b.penalty == 0.0
    # the prompt each agent saw when it acted (b sees a's text)
    assert a.messages == ({"role": "system", "content": "You are a."}, {"role": "user", "content": "say 3\nprevious: "})
    assert b.prompt == "You are b.\n\nsay 3\nprevious: hello"
    assert (b.info["role"], b.info["turn"], b.info["is_action_valid"]) == ("b", 1, True)
    assert "score" not in b.info  # the step info, without the final fields merged into infos
    assert ep.calls_per_agent() == {"a": 1, "b": 1} and ep.invalid_per_agent() == {"a": 1, "b": 0}
    # the record agrees with the AEC view of the same episode
    assert env.infos["b"]["score"] == ep.reward and env._cumulative_rewards == pytest.approx(dict(ep.returns))


def test_history_aliases_and_live_calls_have_no_score():
    env = EchoEnv()
    env.reset(seed=0)
    env.step("ok x")
    (call,) = env.history
    assert (call.agent, call.completion, call.is_action_valid, call.score) == ("a", "ok x", True, None)


def test_record_round_trips_through_json_and_keeps_traj_uid():
    ep = episode_record(_played(["ok", "ok 3"])).with_traj_uid("u/0")
    back = EpisodeRecord.from_dict(json.loads(json.dumps(ep.to_dict())))
    assert back == ep and back.traj_uid == "u/0" and isinstance(back.calls[0], CallRecord)


def test_record_before_the_end_is_an_error():
    env = EchoEnv()
    with pytest.raises(RuntimeError, match=re.escape("EchoEnv.episode_record() needs a finished episode")):
        env.episode_record()
    env.reset(seed=0)
    env.step("ok")
    with pytest.raises(RuntimeError, match="needs a finished episode"):
        env.episode_record()
    with pytest.raises(TypeError, match="object is not a drmas text env"):
        episode_record(object())


def test_record_through_wrappers_is_the_text_envs():
    from drmas_envs.wrappers import NumericInfos

    env = NumericInfos(EchoEnv())
    env.reset(seed=0, options={"task_index": 1})
    env.step("ok")
    env.step("ok 1")
    assert [c.text for c in episode_record(env).calls] == ["ok", "ok 1"] and episode_record(env).won


@pytest.mark.parametrize("env_id", sorted(drmas_envs.registry))
def test_every_registered_env_reports_a_consistent_record(env_id):
    from drmas_envs.testing import check_episode_record

    check_episode_record(env_id)


def test_check_episode_record_names_a_disagreement(monkeypatch):
    from drmas_envs.core.text_env import TextAECEnv
    from drmas_envs.testing import ConformanceError, check_episode_record

    original = TextAECEnv.episode_record

    def lying(self):
        import dataclasses

        return dataclasses.replace(original(self), won=not original(self).won)

    monkeypatch.setattr(TextAECEnv, "episode_record", lying)
    with pytest.raises(ConformanceError, match=r"math-solver-v0: episode record \(seed 0\) won is"):
        check_episode_record("math-solver-v0")


def test_per_agent_rewards_reward_of_and_rows_written_before_them():
    from drmas_envs.core import Task

    record = EpisodeRecord(
        task=Task("g-0", "openspiel/g", "rules", ""), agents=("player_0", "player_1"), calls=(), reward=1.0,
        won=True, agent_rewards={"player_0": 1.0, "player_1": -1.0},
    )  # fmt: skip
    assert (record.reward_of("player_0"), record.reward_of("player_1")) == (1.0, -1.0)
    with pytest.raises(KeyError, match=re.escape("agent 'solver' is not in this episode's agents ['player_0', 'player_1']")):
        record.reward_of("solver")
    assert EpisodeRecord.from_dict(record.to_dict()) == record
    old = record.to_dict()
    del old["agent_rewards"]  # a row written before the field existed: every agent received `reward`
    assert EpisodeRecord.from_dict(old).reward_of("player_1") == 1.0
