"""Tests of benchmarks/stability/run.py: the toy env's rules, spike counting, the Prop. 4.3 prediction from a
metrics row, config errors, and a tiny end-to-end smoke run through the library's trainer."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from helpers.scripts import load_script

run = load_script("benchmarks/stability/run.py", "stability_run")


def _play(env, texts):
    env.reset(seed=0, options={"task_index": 0})
    for text in texts:
        env.step(text)  # stops before the dead steps, so the final infos are still there


def test_env_rewards_are_per_call_bernoulli():
    run.register_env()
    import drmas_envs

    env = drmas_envs.make(run.ENV_ID, solver_calls=3, format_penalty=1.0)
    assert env.possible_agents == ["solver", "verifier"]
    _play(env, ["a 9", "nope", "999", "yes"])
    assert [(r.agent, r.valid) for r in env.history] == [
        ("solver", True), ("solver", False), ("solver", True), ("verifier", True),
    ]  # fmt: skip
    assert env.episode_returns == {"solver": -1.0, "verifier": 0.0}  # one failed solver attempt, R = 0
    assert env.infos["solver"]["won"] is True and env.infos["solver"]["solver_hits"] == 2
    _play(env, ["x", "y", "z", "no"])  # a valid verdict contains "e"
    assert env.episode_returns == {"solver": -3.0, "verifier": -1.0}
    assert env.infos["verifier"]["won"] is False


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"solver_calls": 0}, r"n_tasks and solver_calls must be >= 1, got 16 and 0"),
        ({"format_penalty": 0.0}, r"format_penalty must be > 0 \(it is the only reward signal\), got 0\.0"),
        ({"target": ""}, r"target and verdict_letter must be non-empty strings, got '', 'e'"),
    ],
)
def test_env_bad_args(kw, match):
    with pytest.raises(ValueError, match=match):
        run.TargetVerdictEnv(**kw)


def test_spike_stats_golden():
    norms = [1.0, 2.0, 1.0, 1.0, 1.0, 6.0, 1.0, 4.9, float("nan"), 0.0, 30.0]
    s = run.spike_stats(norms, ratio=5.0, min_history=5)
    # step 5: running median of [1,2,1,1,1] = 1 -> 6 > 5 is a spike; step 7: median 1, 4.9 is not;
    # step 10: median of the 9 finite earlier norms [1,2,1,1,1,6,1,4.9,0] = 1 -> 30 is a spike
    assert s["spikes"] == 2 and s["spike_steps"] == [5, 10]
    assert s["median"] == 1.0 and s["max"] == 30.0 and s["max_over_median"] == 30.0
    assert s["zero_steps"] == 1 and s["nonfinite_steps"] == 1


def test_spike_stats_ignores_zero_median_and_short_history():
    s = run.spike_stats([0.0] * 6 + [1.0, 9.0], min_history=5)
    assert s["spikes"] == 0 and s["max_over_median"] == math.inf  # median 0: nothing to compare against
    assert run.spike_stats([1.0, 100.0], min_history=5)["spikes"] == 0
    with pytest.raises(ValueError, match=r"need ratio > 1 and min_history >= 1, got 1\.0 and 5"):
        run.spike_stats([1.0], ratio=1.0)


def test_predicted_factors_from_metrics_row():
    row = {
        "reward/solver/calls_per_traj": 3.0, "reward/verifier/calls_per_traj": 1.0,
        "reward/solver/mean": -0.9, "reward/verifier/mean": -0.7,
    }  # fmt: skip
    f = run.predicted_factors(row, penalty=1.0)
    # shares 0.75/0.25, success 0.1/0.3: mu = 0.15, sigma^2 = 0.1275
    # solver (0.09 + 0.05^2) / 0.1275, verifier (0.21 + 0.15^2) / 0.1275
    assert f["solver"] == pytest.approx(0.0925 / 0.1275) and f["verifier"] == pytest.approx(0.2325 / 0.1275)
    assert 0.75 * f["solver"] + 0.25 * f["verifier"] == pytest.approx(1.0)
    row["reward/solver/mean"] = row["reward/verifier/mean"] = -1.0  # everyone fails: no variance
    assert run.predicted_factors(row, penalty=1.0) is None


def test_arm_config_rejects_unknown_estimator(tmp_path):
    args = run.main.__globals__["argparse"].Namespace(
        seed=0, iterations=1, threads=1, solver_calls=3, penalty=1.0, model="tiny-llama", batch_size=1,
        group_size=2, max_new_tokens=4, lr=1e-3,
    )  # fmt: skip
    from drmas_train.run.config import ConfigError

    with pytest.raises(ConfigError, match=r"algorithm\.estimator: unknown advantage estimator 'drmsa'"):
        run.arm_config("drmsa", args, tmp_path)
    assert run.arm_config("drmas", args, tmp_path).algorithm.estimator == "drmas"


@pytest.mark.slow  # ~10 s alone, ~30 s on a loaded 2-core machine (two tiny trainer runs)
def test_smoke_run_writes_summary_and_png(tmp_path, capsys):
    argv = ["--iterations", "2", "--estimators", "grpo", "drmas", "--batch-size", "1", "--group-size", "2",
            "--max-new-tokens", "4", "--out", str(tmp_path)]  # fmt: skip
    assert run.main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["arms"]) == {"grpo", "drmas"}
    assert (tmp_path / "stability.png").stat().st_size > 10_000
    for arm in summary["series"].values():
        norms = np.asarray(
            arm["models"]["solver_model"]["grad_norms"] + arm["models"]["verifier_model"]["grad_norms"]
        )
        assert norms.shape == (4,) and np.all(np.isfinite(norms)) and np.all(norms >= 0)
        assert len(arm["agents"]["verifier"]["valid_rate"]) == 2
    # identical seeds: iteration 1 sees identical rollouts in both arms, so identical rewards
    g, d = summary["series"]["grpo"]["agents"], summary["series"]["drmas"]["agents"]
    assert g["solver"]["reward"][0] == d["solver"]["reward"][0]
    assert g["verifier"]["valid_rate"][0] == d["verifier"]["valid_rate"][0]
