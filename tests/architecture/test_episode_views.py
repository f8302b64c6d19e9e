"""Every consumer is a view of the env's EpisodeRecord: rollout Samples/trajectories, eval rows, export rows."""

from __future__ import annotations

import re

import pytest

from drmas_envs.core import play_episode
from drmas_envs.wrappers import episodes_to_rows
from drmas_train.backends.base import SamplingParams
from drmas_train.collect.rollout import rollout
from drmas_train.eval.results import episode_fields
from drmas_train.model.assignment import ModelPool
from helpers.backend_fakes import ScriptedBackend
from helpers.echo_env import EchoEnv


def _echo_reply(messages, call, row):
    if messages[0]["content"] == "You are a.":
        return "hello"
    return "ok " + re.match(r"say (\d+)", messages[-1]["content"]).group(1)


def test_result_row_fields_are_a_view_of_the_record():
    episode = play_episode(EchoEnv(), {"a": lambda o: "hello", "b": lambda o: "ok 2"}, options={"task_index": 2})
    fields = episode_fields(episode, wall_time_s=0.5, tokens_in={"a": 7}, finish_reasons=["stop", "length"],
                            transcripts=True)  # fmt: skip
    assert fields == {
        "data_source": "echo",
        "task_id": "t2",
        "num_turns": 2,
        "reward": 1.0,
        "won": True,
        "returns": pytest.approx({"a": 0.9, "b": 1.0}),
        "calls": {"a": 1, "b": 1},
        "invalid_actions": {"a": 1, "b": 0},
        "tokens_in": {"a": 7, "b": 0},
        "tokens_out": {"a": 0, "b": 0},
        "wall_time_s": 0.5,
        "truncated": False,
        "finish_reasons": ["stop", "length"],
        # each transcript entry says whether its reply was cut at max_new_tokens (finish reason "length")
        "transcript": [{"agent": "a", "text": "hello", "valid": False, "truncated": False},
                       {"agent": "b", "text": "ok 2", "valid": True, "truncated": True}],
    }
    assert "truncated" not in episode_fields(episode, wall_time_s=0.0)  # scripted runs have no finish reasons


def test_rollout_trajectories_carry_the_record_behind_their_samples():
    pool = ModelPool({"m": None}, {"m": ScriptedBackend(_echo_reply)}, {"*": "m"})  # type: ignore[arg-type]
    result = rollout(EchoEnv, [1, 4], 2, pool, SamplingParams(max_new_tokens=4), seed=0, progress=False)
    for traj in result.trajectories:
        ep = traj.episode
        assert ep.traj_uid == traj.traj_uid and (traj.task_id, traj.won, traj.score) == (ep.task_id, True, 1.0)
        samples = [s for s in result.samples if s.traj_uid == traj.traj_uid]
        assert [(s.agent_id, s.response_text, s.reward) for s in samples] == [
            (c.agent_id, c.text, c.score) for c in ep.calls
        ]
        assert ep.calls[1].prompt == f"You are b.\n\nsay {ep.ground_truth[0]}\nprevious: hello"
    # the same record feeds the dataset export: its rows agree with the training samples
    rows = episodes_to_rows([t.episode for t in result.trajectories])
    assert [r["reward"] for r in rows["a"]] == [s.reward for s in result.samples if s.agent_id == "a"]
    assert [r["ground_truth"] for r in rows["b"]] == [["1"], ["1"], ["4"], ["4"]]


@pytest.mark.slow
def test_llm_eval_of_a_search_env_on_its_default_tasks(tmp_path):
    """Regression: LLM eval made each env from the probe's task list alone, so a search env lost its corpus."""
    import torch

    from drmas_train.eval.evaluate import EvalConfig, evaluate

    torch.set_num_threads(1)
    cfg = EvalConfig(envs=["search-orchestrator-v0"], limit=2, k=2, policy="llm", model="tiny-llama",
                     max_new_tokens=6, batch_tasks=2, transcripts=True)  # fmt: skip
    rows = evaluate(cfg, tmp_path / "run", progress=False).episodes
    assert len(rows) == 4 and all(len(r["transcript"]) == r["num_turns"] == sum(r["calls"].values()) for r in rows)
    assert all({"em", "f1", "num_searches"} <= set(r) and len(r["finish_reasons"]) == r["num_turns"] for r in rows)
