"""benchmarks/learning/advantage_overlap.py: several presets' advantages on the same saved batches, split into
outcome-flat and outcome-varied prompt groups; golden values from the estimators' definitions on a hand-built batch."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from drmas_train.algorithm.sample_advantages import sample_advantages
from drmas_train.collect.sample_io import save_samples
from drmas_train.collect.samples import Sample
from drmas_train.run.config import load_config
from helpers.scripts import load_script

HALF_SQRT2 = math.sqrt(2) / 2  # (x - mean) / std of a two-value group with the unbiased std: +-1/sqrt(2)


def _module():
    return load_script("benchmarks/learning/advantage_overlap.py", "advantage_overlap_bench")


def _call(uid, traj, agent, turn, reward, score):
    return Sample(uid, traj, agent, "m", turn, 0, [1], [2, 3], [0.0, 0.0], [1, 1], reward=reward, score=score,
                  won=score == 1.0)  # fmt: skip


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


def test_an_opposite_sign_is_counted_and_batches_are_normalised_apart():
    """One outcome-varied group of three episodes (scores 1, 0.45 and 0; every verifier call invalid, -0.1). Per agent
    (Dr. MAS) the solver's mean is 0.483 and its 0.45 call is below it; pooled over all six calls (``grpo_step``) the
    mean is 0.433 and that call is above it: exactly one call of opposite sign. A second batch with the rewards
    negated gets the negated advantages (each batch is normalised on its own, as in training)."""
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
    twice = mod.overlap([group, negated], {"drmas": algorithms["quickstart_math"], "same": algorithms["quickstart_math"]})
    assert twice["calls"] == 12 and twice["presets"]["same"]["outcome_varied"]["corr_with_reference"] == pytest.approx(1.0)
    np.testing.assert_allclose(sample_advantages(negated, algorithms["quickstart_math"]),
                               -sample_advantages(group, algorithms["quickstart_math"]))  # fmt: skip


def test_estimators_needing_more_than_the_samples_are_refused():
    algorithms = {p: load_config(p).algorithm for p in ("quickstart_math", "quickstart_math_gae")}
    with pytest.raises(ValueError, match="quickstart_math_gae: estimator 'gae' needs more than the saved samples"):
        _module().overlap([_batch()], algorithms)


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
