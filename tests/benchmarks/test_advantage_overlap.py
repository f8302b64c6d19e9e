"""benchmarks/learning/advantage_overlap.py: several presets' advantages on the same saved batches, split into
outcome-flat and outcome-varied prompt groups; golden values from the estimators' definitions on a hand-built batch."""

from __future__ import annotations

import json
import math

import pytest

from drmas_train.collect.sample_io import save_samples
from drmas_train.collect.samples import Sample
from drmas_train.run.config import load_config
from helpers.scripts import load_script

HALF_SQRT2 = math.sqrt(2) / 2  # (x - mean) / std of a two-value group with the unbiased std: +-1/sqrt(2)


def _module():
    return load_script("benchmarks/learning/advantage_overlap.py", "advantage_overlap_bench")


def _call(uid, traj, agent, turn, reward, score):
    return Sample(uid, traj, agent, "m", turn, 0, [1], [2, 3], [0.0, 0.0], [1, 1], reward=reward, score=score,
                  won=score == 1.0, anchor_key=f"{uid}/{agent}")  # fmt: skip


def _batch():
    """Two prompt groups of two math episodes (solver, then verifier; an invalid call is penalised by 0.1).

    u1, outcome-flat (both fail): t0's solver is valid, every other call invalid.
    u2, outcome-varied: t2 solves the task (its verifier invalid), t3 fails (its verifier invalid).
    """
    return [
        _call("u1", "t0", "solver", 0, 0.0, 0.0), _call("u1", "t0", "verifier", 1, -0.1, 0.0),
        _call("u1", "t1", "solver", 0, -0.1, 0.0), _call("u1", "t1", "verifier", 1, -0.1, 0.0),
        _call("u2", "t2", "solver", 0, 1.0, 1.0), _call("u2", "t2", "verifier", 1, 0.9, 1.0),
        _call("u2", "t3", "solver", 0, 0.0, 0.0), _call("u2", "t3", "verifier", 1, -0.1, 0.0),
    ]  # fmt: skip


def test_outcome_flat_marks_the_groups_whose_trajectories_share_one_score():
    assert _module().outcome_flat(_batch()).tolist() == [True] * 4 + [False] * 4


def test_drmas_and_grpo_on_a_hand_built_batch_golden_values():
    """u1: Dr. MAS's solver group {0, -0.1} gives +-1/sqrt(2), its verifier group {-0.1, -0.1} no spread, so 0;
    GRPO's trajectory scores {-0.05, -0.1} give +-1/sqrt(2) to all four calls. u2: both give +-1/sqrt(2) with the
    same signs (per agent {1, 0} and {0.9, -0.1}; per trajectory {0.95, -0.05})."""
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_grpo")}
    out = _module().overlap([_batch()], algorithms)
    assert (out["calls"], out["outcome_flat_share"], out["reference"]) == (8, 0.5, "quickstart_math")
    drmas, grpo = out["presets"]["quickstart_math"], out["presets"]["quickstart_math_grpo"]
    assert (drmas["estimator"], grpo["estimator"]) == ("drmas", "grpo")
    assert drmas["outcome_flat"]["nonzero_share"] == 0.5
    assert drmas["outcome_flat"]["mean_abs"] == pytest.approx(HALF_SQRT2 / 2, rel=1e-4)
    assert grpo["outcome_flat"]["nonzero_share"] == 1.0
    assert grpo["outcome_flat"]["mean_abs"] == pytest.approx(HALF_SQRT2, rel=1e-4)
    for row in (drmas, grpo):
        assert row["outcome_varied"]["mean_abs"] == pytest.approx(HALF_SQRT2, rel=1e-4)
    varied = grpo["outcome_varied"]
    assert varied["corr_with_reference"] == pytest.approx(1.0) and varied["opposite_sign"] == 0
    assert varied["rms_ratio"] == pytest.approx({"solver": 1.0, "verifier": 1.0})
    assert "corr_with_reference" not in drmas["outcome_varied"]  # the reference is not compared with itself
    assert (drmas["grouping"], grpo["grouping"]) == ("prompt_agent", "prompt")  # the groupings used


def test_dr_grpo_is_drmas_scaled_where_outcomes_vary_and_near_zero_where_they_do_not():
    """Dr. GRPO (no std division): u2's trajectory scores {0.95, -0.05} give +-0.5, so its RMS is 0.5 / (1/sqrt(2)) =
    0.7071 of Dr. MAS's for each agent; u1's {-0.05, -0.1} give +-0.025."""
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_dr_grpo")}
    row = _module().overlap([_batch()], algorithms)["presets"]["quickstart_math_dr_grpo"]
    assert row["outcome_varied"]["rms_ratio"] == pytest.approx({"solver": HALF_SQRT2, "verifier": HALF_SQRT2}, rel=1e-4)
    assert row["outcome_varied"]["mean_abs"] == pytest.approx(0.5)
    assert row["outcome_flat"] == pytest.approx({"nonzero_share": 1.0, "mean_abs": 0.025})


def test_batches_are_normalised_apart_even_when_their_prompt_ids_repeat():
    """Two batches reuse prompt id u1: one with every episode failing, one (rewards + 1) with every episode solving
    the task. Apart, both groups are outcome-flat and Dr. MAS gives the solver calls +-1/sqrt(2), the verifier's 0
    (as in training, each batch is normalised on its own); pooled into one group they would not be flat."""
    fail = _batch()[:4]
    solve = [_call(s.uid, s.traj_uid, s.agent_id, s.turn, s.reward + 1.0, 1.0) for s in fail]
    out = _module().overlap([fail, solve], {"drmas": load_config("quickstart_math").algorithm})
    assert out["outcome_flat_share"] == 1.0
    assert out["presets"]["drmas"]["outcome_flat"] == pytest.approx({"nonzero_share": 0.5, "mean_abs": HALF_SQRT2 / 2},
                                                                     rel=1e-4)  # fmt: skip


def test_a_zero_advantage_is_not_of_opposite_sign():
    """An outcome-varied group (scores 1 and 0.9) whose two Verifier calls have the same reward (0.9: one invalid, one
    valid): Dr. MAS gives them 0, GRPO +-1/sqrt(2) (trajectory scores 0.95 and 0.9). Nothing is of opposite sign."""
    group = [
        _call("u4", "t9", "solver", 0, 1.0, 1.0), _call("u4", "t9", "verifier", 1, 0.9, 1.0),
        _call("u4", "t10", "solver", 0, 0.9, 0.9), _call("u4", "t10", "verifier", 1, 0.9, 0.9),
    ]  # fmt: skip
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_grpo")}
    varied = _module().overlap([group], algorithms)["presets"]["quickstart_math_grpo"]["outcome_varied"]
    assert varied["opposite_sign"] == 0
    assert varied["rms_ratio"]["verifier"] is None and varied["rms_ratio"]["solver"] == pytest.approx(1.0, rel=1e-4)  # Dr. MAS's verifier RMS is 0


def test_an_opposite_sign_is_counted():
    """One outcome-varied group of three episodes (scores 1, 0.45 and 0; every verifier call invalid, -0.1). Per agent
    (Dr. MAS) the solver's mean is 0.483 and its 0.45 call is below it; pooled over all six calls (``grpo_step``) the
    mean is 0.433 and that call is above it: exactly one call of opposite sign."""
    mod = _module()
    group = [
        _call("u3", "t6", "solver", 0, 1.0, 1.0), _call("u3", "t6", "verifier", 1, 0.9, 1.0),
        _call("u3", "t7", "solver", 0, 0.45, 0.45), _call("u3", "t7", "verifier", 1, 0.35, 0.45),
        _call("u3", "t8", "solver", 0, 0.0, 0.0), _call("u3", "t8", "verifier", 1, -0.1, 0.0),
    ]  # fmt: skip
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_grpo_step")}
    out = mod.overlap([group], algorithms)
    assert out["outcome_flat_share"] == 0.0
    assert out["presets"]["quickstart_math_grpo_step"]["outcome_varied"]["opposite_sign"] == 1
    negated = [_call(s.uid, s.traj_uid, s.agent_id, s.turn, -s.reward, s.score) for s in group]
    mirrored = mod.overlap([negated], algorithms)["presets"]["quickstart_math_grpo_step"]["outcome_varied"]
    assert mirrored["opposite_sign"] == 1  # negating every reward negates both estimators' advantages


def test_estimators_needing_more_than_the_samples_are_refused():
    mod = _module()
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_gae")}
    with pytest.raises(ValueError, match="quickstart_math_gae: estimator 'gae' needs more than the saved samples"):
        mod.overlap([_batch()], algorithms)
    kl = {"kl": load_config("quickstart_math_kl_reward").algorithm}
    with pytest.raises(ValueError, match=r"kl: algorithm.overlong_buffer=0, reward_kl_coef=0.0\d+ shape the rewards"):
        mod.overlap([_batch()], kl)
    gigpo = {"gigpo": load_config("quickstart_math_gigpo").algorithm}  # gamma 0.95: discounted over env steps
    with pytest.raises(ValueError, match=r"gigpo with gamma=0.95 .* \(--env-step; accepted: round, episode\)"):
        mod.overlap([_batch()], gigpo)
    assert mod.overlap([_batch()], gigpo, env_step="episode")["env_step"] == "episode"


def test_a_run_is_checked_against_the_advantages_its_training_logged(tmp_path):
    """A tiny training run with saved samples: its own algorithm recomputed offline gives every agent the advantage
    mean and std the run logged (deviation 0 up to rounding); another algorithm does not."""
    from drmas_train.run.config import to_yaml
    from drmas_train.run.trainer import train
    from helpers.tiny_rl import tiny_config, tiny_loader

    mod = _module()
    run = tmp_path / "run"
    train(tiny_config(run, "run.iterations=2", "run.save_samples=true"), loader=tiny_loader)
    assert mod.training_deviation(run) < 1e-9
    assert mod.run_env_step(run) == "round"  # the tiny env's default
    cfg = tiny_config(run, "run.iterations=2", "algorithm.estimator=grpo_step")
    (run / "config.yaml").write_text(to_yaml(cfg))  # as if it had trained with another estimator
    assert mod.training_deviation(run) > 0.01
    (run / "config.yaml").write_text(to_yaml(tiny_config(run, "algorithm.estimator=gae")))
    assert mod.training_deviation(run) is None  # not evaluable from the samples


def test_the_script_reads_a_runs_saved_samples_and_exits_2_without_them(tmp_path, capsys):
    mod = _module()
    run = tmp_path / "run"
    save_samples(_batch(), run / "samples" / "iter_000001.jsonl")
    (tmp_path / "run.log").write_text("a log a shell glob also matches\n")
    assert mod.main([str(run), str(tmp_path / "run.log"), "--presets", "quickstart_math", "quickstart_math_grpo"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == [str(run)] and out["calls"] == 8
    assert out["presets"]["quickstart_math_grpo"]["outcome_flat"]["nonzero_share"] == 1.0
    assert mod.main([str(tmp_path)]) == 2
    assert "no samples/iter_*.jsonl" in capsys.readouterr().err
    assert mod.main([str(run), "--presets", "quickstart_math_remax"]) == 2
    assert "needs more than the saved samples" in capsys.readouterr().err
