"""The text AEC base (drmas_envs.core.TextAECEnv) through the tiny EchoEnv: errors, dead steps, penalties."""

from __future__ import annotations

import re

import pytest

from drmas_envs.core import Task
from helpers.echo_env import EchoEnv


def _play(env, actions):
    for action in actions:
        env.step(action)


def test_step_before_reset():
    with pytest.raises(
        RuntimeError, match=re.escape("EchoEnv.step() called before reset(); call env.reset(seed=...) first")
    ):
        EchoEnv().step("ok")


@pytest.mark.parametrize("action", [3, b"ok", ["ok"], None])
def test_non_str_action_names_agent_and_type(action):
    env = EchoEnv()
    env.reset(seed=0)
    kind = type(action).__name__
    with pytest.raises(
        TypeError, match=re.escape(f"action for agent 'a' must be a str (the model's text), got {kind}")
    ):
        env.step(action)


def test_dead_agent_action_must_be_none():
    env = EchoEnv()
    env.reset(options={"task_index": 2})
    _play(env, ["ok", "ok 2"])
    assert all(env.terminations.values())
    with pytest.raises(
        ValueError,
        match=re.escape(
            "agent 'a' is done (terminated or truncated); its only valid action is None, got 'more'"
        ),
    ):
        env.step("more")
    env.step(None)
    env.step(None)
    assert env.agents == []


def test_penalties_and_cumulative_rewards():
    # task 2 (answer "2"): a invalid (no "ok"), b valid and says "2" -> R = 1; a pays 0.1 once.
    env = EchoEnv(format_penalty=0.1)
    env.reset(options={"task_index": 2})
    env.step("nothing")
    assert env.infos["a"]["is_action_valid"] is False and env.infos["a"]["penalty"] == 0.1
    assert env.rewards["a"] == pytest.approx(-0.1)
    env.step("ok 2")
    assert env.infos["b"]["penalty"] == 0.0
    assert env.rewards == pytest.approx({"a": 1.0, "b": 1.0})
    assert env.episode_returns == pytest.approx({"a": 0.9, "b": 1.0})
    _, reward_a, terminated, truncated, info = env.last()
    # last() gives a's reward accumulated since its own action: its -0.1 penalty plus R = 1.
    assert (env.agent_selection, reward_a, terminated, truncated) == ("a", pytest.approx(0.9), True, False)
    assert (info["won"], info["score"], info["task_id"], info["data_source"]) == (True, 1.0, "t2", "echo")


def test_reset_options_pick_the_task():
    env = EchoEnv()
    env.reset(options={"task_index": 4})
    assert env.task.task_id == "t4"
    custom = Task("mine", "x", "q", "a")
    env.reset(options={"task": custom})
    assert env.task is custom
    with pytest.raises(ValueError, match=re.escape("options['task_index'] must be an int in [0, 5), got 5")):
        env.reset(options={"task_index": 5})
    with pytest.raises(ValueError, match="options\\['task'\\] must be a drmas_envs Task, got dict"):
        env.reset(options={"task": {"task_id": "x"}})


def test_same_seed_same_task_and_render():
    picks = set()
    for _ in range(2):
        env = EchoEnv(render_mode="ansi")
        env.reset(seed=123)
        _play(env, ["ok", "bad"])
        picks.add((env.task.task_id, env.render()))
    assert len(picks) == 1
    text = picks.pop()[1]
    assert "--- turn 1 · b  (invalid) ---" in text and "episode over" in text


def test_spaces_are_identity_stable_and_close_twice():
    env = EchoEnv()
    assert env.observation_space("a") is env.observation_space("a")
    assert env.action_space("b") is env.action_space("b")
    assert env.action_space("a").contains("ünïcode") and env.action_space("a").contains("")
    env.close()
    env.close()


def test_numpy_task_index_is_accepted():
    import numpy as np

    env = EchoEnv()
    env.reset(options={"task_index": np.int64(3)})
    assert env.task.task_id == "t3"


def test_human_render_mode_prints_each_turn_as_the_env_steps(capsys):
    """PettingZoo's convention: with render_mode="human" the env renders itself as it steps, no render() call."""
    env = EchoEnv(render_mode="human")
    env.reset(options={"task_index": 2})
    assert capsys.readouterr().out == "# task t2 [echo]\nsay 2\n\n"
    env.step("ok from a")
    assert capsys.readouterr().out == "--- turn 0 · a ---\nok from a\n"
    env.step("bad\n2")  # invalid (no "ok"), and it ends the episode
    assert capsys.readouterr().out == (
        "--- turn 1 · b  (invalid) ---\nbad\n2\n=== episode over; returns: {'a': 1.0, 'b': 0.9} ===\n"
    )
    env.render()  # everything was shown already
    assert capsys.readouterr().out == ""
    env.reset(options={"task_index": 0})  # a new episode starts a new transcript
    assert capsys.readouterr().out.startswith("# task t0 [echo]\n")


def test_ansi_render_mode_prints_nothing_and_returns_the_transcript(capsys):
    env = EchoEnv(render_mode="ansi")
    env.reset(options={"task_index": 2})
    env.step("ok from a")
    assert capsys.readouterr().out == ""
    assert env.render() == "# task t2 [echo]\nsay 2\n\n--- turn 0 · a ---\nok from a"
