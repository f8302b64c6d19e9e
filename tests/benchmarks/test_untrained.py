"""benchmarks/learning/untrained.py: the candidate figures it prints (docs/quickstart.md's candidate tables)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helpers.scripts import load_script


def _module():
    return load_script("benchmarks/learning/untrained.py", "untrained_learning")


def _sample(agent, uid, reward, valid, prompt=4, response=2):
    return SimpleNamespace(agent_id=agent, uid=uid, reward=reward, is_action_valid=valid,
                           prompt_ids=[0] * prompt, response_ids=[0] * response)  # fmt: skip


def _traj(uid, won, ended_by):
    return SimpleNamespace(uid=uid, won=won, episode=SimpleNamespace(metrics={"ended_by": ended_by}))


def test_summarize_counts_accuracy_validity_and_groups_with_reward_variance():
    # group g1: two episodes, one won; the verifier's rewards differ (1.0 vs 0.0), the answer's too (1.0 vs -0.01)
    # group g2: two lost episodes; the verifier's rewards are equal (0.0, 0.0), the answer acted once (one value)
    samples = [
        _sample("verifier", "g1", 1.0, True), _sample("answer", "g1", 1.0, True),
        _sample("verifier", "g1", 0.0, True), _sample("answer", "g1", -0.01, False),
        _sample("verifier", "g2", 0.0, True), _sample("verifier", "g2", 0.0, True),
        _sample("answer", "g2", -0.01, False, prompt=8, response=6),
    ]  # fmt: skip
    trajectories = [_traj("g1", True, "answer"), _traj("g1", False, "answer"), _traj("g2", False, "step_limit"),
                    _traj("g2", False, "answer")]  # fmt: skip
    out = _module().summarize(samples, trajectories)
    assert out["episodes"] == 4 and out["accuracy"] == 0.25
    assert out["valid"] == {"answer": pytest.approx(1 / 3, abs=1e-4), "verifier": 1.0}
    assert out["varied_groups"] == {"answer": 0.5, "verifier": 0.5}  # g1 varies for both; g2 for neither
    assert out["calls_per_episode"] == {"answer": 0.75, "verifier": 1.0}
    assert out["ended_by"] == {"answer": 3, "step_limit": 1}
    assert out["prompt_tokens"] == pytest.approx(32 / 7, abs=0.05) and out["response_tokens"] == pytest.approx(18 / 7, abs=0.05)  # fmt: skip
