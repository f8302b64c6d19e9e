"""benchmarks/learning/quickstart.py: the learning figures it prints (the ones docs/quickstart.md quotes)."""

from __future__ import annotations

import pytest

from helpers.scripts import load_script


def _module():
    return load_script("benchmarks/learning/quickstart.py", "quickstart_learning")


def test_summarize_reads_validation_gain_and_per_agent_validity():
    rows = [
        {"iteration": 0, "val/avg@4": 0.1, "val/avg@4_stderr": 0.03, "val/pass@4": 0.3},
        {"iteration": 1, "rollout/accuracy": 0.25, "reward/solver/valid_action_ratio": 0.5,
         "reward/verifier/valid_action_ratio": 0.0},
        {"iteration": 2, "rollout/accuracy": 0.5, "reward/solver/valid_action_ratio": 1.0,
         "reward/verifier/valid_action_ratio": 0.25, "val/avg@4": 0.5, "val/avg@4_stderr": 0.08,
         "val/avg@4_gain": 0.4, "val/avg@4_gain_stderr": 0.08},
    ]  # fmt: skip
    out = _module().summarize(rows)
    assert out["validation"] == [{"iteration": 0, "avg@4": 0.1, "stderr": 0.03},
                                 {"iteration": 2, "avg@4": 0.5, "stderr": 0.08, "gain": 0.4, "gain_stderr": 0.08}]  # fmt: skip
    assert out["gain_over_stderr"] == pytest.approx(5.0)
    assert out["train_accuracy"] == [0.25, 0.5]
    assert out["valid_action_ratio"] == {"solver": [0.5, 1.0], "verifier": [0.0, 0.25]}
    with pytest.raises(ValueError, match="no validation rows"):
        _module().summarize([{"iteration": 1, "rollout/accuracy": 0.5}])


@pytest.mark.slow
def test_script_runs_the_preset_and_prints_the_paired_gain(tmp_path, capsys):
    out = _module().main(["--run-dir", str(tmp_path), "models.shared.name_or_path=tiny-qwen3", "run.iterations=1",
                          "rollout.batch_size=1", "rollout.group_size=2", "rollout.max_new_tokens=4", "eval.size=2",
                          "eval.k=2", "run.save_every=0", "run.tensorboard=false", "run.plot=false",
                          "run.num_threads=1"])  # fmt: skip
    assert capsys.readouterr().out.strip().startswith('{"config": "quickstart_math"')
    first, last = out["validation"]
    assert (first["iteration"], last["iteration"]) == (0, 1)
    assert last["gain"] == pytest.approx(last["avg@2"] - first["avg@2"])  # same tasks: paired mean = difference  # fmt: skip
    assert out["wall_time_s"] > 0 and out["peak_rss_gb"] > 0 and set(out["valid_action_ratio"]) == {"solver", "verifier"}  # fmt: skip


def test_summarize_run_reads_a_finished_run_directory(tmp_path, capsys):
    """``--summarize RUN_DIR``: the same figures from a run directory's files, plus its seed, estimator, seconds
    per iteration and wall time; a folder that is not a finished run is refused with exit code 2."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"iteration": 0, "val/avg@4": 0.1, "val/avg@4_stderr": 0.03},
            {"iteration": 1, "rollout/accuracy": 0.5, "reward/a/valid_action_ratio": 1.0, "perf/iteration_s": 12.5,
             "val/avg@4": 0.3, "val/avg@4_stderr": 0.05, "val/avg@4_gain": 0.2, "val/avg@4_gain_stderr": 0.1}]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"wall_time_s": 61.04}))
    (run / "config.yaml").write_text("seed: 3\nalgorithm:\n  estimator: grpo\n")
    out = _module().main(["--summarize", str(run)])
    assert json.loads(capsys.readouterr().out) == out
    assert (out["seed"], out["estimator"], out["iteration_s"], out["wall_time_s"]) == (3, "grpo", [12.5], 61.0)
    assert out["gain_over_stderr"] == pytest.approx(2.0) and out["valid_action_ratio"] == {"a": [1.0]}
    (run / "summary.json").unlink()
    with pytest.raises(SystemExit) as stop:
        _module().main(["--summarize", str(run)])
    assert stop.value.code == 2 and "summary.json is missing" in capsys.readouterr().err
