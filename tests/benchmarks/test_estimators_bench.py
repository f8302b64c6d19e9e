"""benchmarks/learning/estimators.py: one quickstart preset per estimator, the per-run figures, their seed means, the
pooled held-out cell, and the script end to end (training runs -> ``drmas leaderboard`` pages)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drmas_train.algorithm.advantages import ESTIMATORS
from drmas_train.run.config import load_config
from drmas_train.run.metrics_log import read_metrics
from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "learning" / "estimators.py"


def _module():
    return load_script("benchmarks/learning/estimators.py", "estimators_bench")


def test_a_run_stopped_after_a_checkpoint_of_its_own_config_is_resumed_from_it(tmp_path):
    """``resume_point``: the latest checkpoint of an unfinished attempt with this run's resolved config exactly; none
    for another config (another seed), for no checkpoint, or for a finished run's kept last checkpoint."""
    from drmas_train.run.checkpoint import save_checkpoint
    from drmas_train.run.config import to_yaml

    mod = _module()
    run_dir = tmp_path / "seed_0"
    cfg = load_config("quickstart_math_grpo", [f"run.dir={run_dir}", "run.num_threads=1", "seed=0"])
    other = load_config("quickstart_math_grpo", [f"run.dir={run_dir}", "run.num_threads=1", "seed=1"])
    assert mod.resume_point(run_dir, cfg) is None  # nothing there

    def save(config, iteration, elapsed):
        return save_checkpoint(run_dir / "checkpoints", iteration, write_state=lambda folder: None, sampler_state={},
                               config_yaml=to_yaml(config), extra={"elapsed_s": elapsed}, keep=3)  # fmt: skip

    save(cfg, 4, 321.5)
    assert mod.resume_point(run_dir, cfg) == run_dir / "checkpoints" / "iter_000004"
    assert mod._checkpoint_elapsed(run_dir / "checkpoints" / "iter_000004") == 321.5
    assert mod.resume_point(run_dir, other) is None  # another seed's attempt: replaced, not continued
    save(cfg, cfg.run.iterations, 700.0)
    assert mod.resume_point(run_dir, cfg) is None  # a finished run: trained again (--rerun), not resumed


def test_the_default_presets_cover_every_estimator_of_the_registry_and_dr_grpo():
    configs = {p: load_config(p).algorithm for p in _module().PRESETS}
    assert {a.estimator for a in configs.values()} == set(ESTIMATORS)
    dr = configs["quickstart_math_dr_grpo"]
    assert (dr.estimator, dr.norm_by_std, dr.loss_agg) == ("grpo", False, "seq-mean-token-sum")
    assert all(a.grouping is None for a in configs.values())  # each estimator with its own default grouping


def _rows():
    return [
        {"iteration": 0, "val/avg@4": 0.25, "val/avg@4_stderr": 0.1, "val/pass@4": 0.5},
        {"iteration": 1, "loss/shared/grad_norm": 1.0, "loss/shared/grad_norm_max": 1.5, "adv/solver/mean": 0.3,
         "adv/solver/std": 0.4, "adv/verifier/mean": 0.0, "adv/verifier/std": 0.0, "rollout/accuracy": 0.5,
         "reward/solver/valid_action_ratio": 0.5, "critic/shared/vf_loss": 0.8,
         "critic/solver/explained_variance": -0.5},
        {"iteration": 2, "loss/shared/grad_norm": 3.0, "loss/shared/grad_norm_max": 4.0, "adv/solver/mean": 0.0,
         "adv/solver/std": 1.0, "adv/verifier/mean": 0.0, "adv/verifier/std": 2.0, "rollout/accuracy": 1.0,
         "reward/solver/valid_action_ratio": 1.0, "critic/shared/vf_loss": 0.2,
         "critic/solver/explained_variance": 0.4, "val/avg@4": 0.5, "val/avg@4_stderr": 0.12,
         "val/avg@4_gain": 0.25, "val/avg@4_gain_stderr": 0.05},
    ]  # fmt: skip


def test_run_record_reads_gain_grad_norms_advantage_scale_and_critic():
    rec = _module().run_record(_rows())
    assert (rec["k"], rec["initial"], rec["final"], rec["gain"], rec["gain_stderr"]) == (
        4,
        0.25,
        0.5,
        0.25,
        0.05,
    )
    assert rec["final_iteration"] == 2 and rec["final_stderr"] == 0.12
    assert rec["grad_norm"] == {"shared": 2.0} and rec["grad_norm_max"] == {"shared": 4.0}
    assert rec["adv_rms"] == pytest.approx(
        {"solver": (0.5 + 1.0) / 2, "verifier": 1.0}
    )  # hypot(0.3, 0.4) = 0.5
    assert rec["valid_action_ratio"] == {"solver": 1.0} and rec["train_accuracy"] == 0.75
    assert rec["critic"] == {"vf_loss/shared": {"first": 0.8, "last": 0.2},
                             "explained_variance/solver": {"first": -0.5, "last": 0.4}}  # fmt: skip
    with pytest.raises(ValueError, match="validation at iteration 0"):
        _module().run_record(_rows()[1:])


def test_a_game_runs_record_is_its_return_gain_averaged_over_the_roles():
    """A game validates one task (the rules), so avg@k has no per-task gain; the record's outcome is the return
    against the first validation opponent, its gain the mean of the seats' gains (PROTOCOL.md's game outcome)."""

    def val(it, r0, r1, **extra):
        return {"iteration": it, "val/avg@256": 0.5, "val/avg@256_stderr": 0.03, "val/random-v0/all/return": (r0 + r1) / 2,
                "val/random-v0/all/return_se": 0.1, "val/random-v0/player_0/return": r0,
                "val/random-v0/player_1/return": r1, "val/cfr-v0/all/return": -1.0, **extra}  # fmt: skip

    rows = [val(0, 0.125, -0.125), {"iteration": 1, "loss/shared/grad_norm": 1.0},
            val(2, 0.5, 0.0, **{"val/random-v0/return_gain": 0.25, "val/random-v0/return_gain_se": 0.08})]  # fmt: skip
    rec = _module().run_record(rows)
    assert rec["outcome"] == "return vs random-v0" and rec["k"] == 256
    assert (rec["initial"], rec["final"], rec["final_stderr"]) == (0.0, 0.25, 0.1)
    assert rec["gain"] == pytest.approx((0.375 + 0.125) / 2) and rec["gain_stderr"] == 0.08
    assert _module().run_record(_rows())["outcome"] == "held-out avg@4"


def test_pooled_cell_is_avg_and_unbiased_pass_at_k_over_every_seeds_tasks():
    cell = _module().pooled_cell([{"a": 1.0, "b": 0.5}, {"c": 0.0, "d": 0.25}], 4)
    assert (cell["num_tasks"], cell["num_episodes"], cell["samples_per_task"]) == (4, 16, 4)
    assert cell["avg@k"]["value"] == pytest.approx(1.75 / 4)
    # pass@2 per task, 1 - C(4-c, 2) / C(4, 2): c=4 -> 1, c=2 -> 5/6, c=0 -> 0, c=1 -> 1/2
    assert cell["pass@k"]["2"]["value"] == pytest.approx((1 + 5 / 6 + 0 + 0.5) / 4)
    assert cell["pass@k"]["4"]["value"] == pytest.approx(0.75) and cell["pass@k"]["1"][
        "value"
    ] == pytest.approx(1.75 / 4)
    with pytest.raises(ValueError, match="not a share of k=4"):
        _module().pooled_cell([{"a": 0.3}], 4)


def test_aggregate_is_the_mean_and_standard_error_over_seeds():
    base = {**_module().run_record(_rows()), "wall_time_s": 600.0, "load_start": 1.0, "peak_rss_gb": 6.0}
    other = {
        **base,
        "seed": 1,
        "gain": 0.35,
        "wall_time_s": 720.0,
        "grad_norm": {"shared": 4.0},
        "peak_rss_gb": 7.0,
    }
    agg = _module().aggregate([{**base, "seed": 0}, other])
    assert agg["seeds"] == [0, 1]
    assert agg["gain"]["value"] == pytest.approx(0.3) and agg["gain"]["n"] == 2
    assert agg["gain"]["stderr"] == pytest.approx(0.05)  # std (ddof 1) 0.0707 / sqrt(2)
    assert agg["grad_norm"]["shared"]["value"] == pytest.approx(3.0) and agg["peak_rss_gb"] == 7.0
    assert agg["critic"]["vf_loss/shared/last"]["value"] == pytest.approx(0.2)
    metrics = _module().run_metrics(agg, 4)
    assert metrics["held-out gain avg@4"] is agg["gain"] and metrics["seeds"]["value"] == 2
    assert (
        metrics["wall time min"]["value"] == pytest.approx(11.0)
        and metrics["value loss shared last"]["n"] == 2
    )


def _saved(runs, presets, failed=(), seeds=3):
    """A results.json as the script writes it: ``runs`` as (preset, seed, gain), ``presets`` their aggregates."""
    return {"presets": {p: {"seeds": [r[1] for r in runs if r[0] == p]} for p in presets}, "failed": list(failed),
            "seeds": seeds, "first_seed": 0, "iterations": None, "overrides": [], "wall_time_s": 1.0,
            "runs": [{"preset": p, "seed": s, "gain": g} for p, s, g in runs]}  # fmt: skip


def test_merging_keeps_other_presets_and_seeds_and_replaces_a_run_measured_again():
    mod = _module()
    rloo, gae, grpo = "quickstart_math_rloo", "quickstart_math_gae", "quickstart_math_grpo"
    earlier = _saved([(rloo, 0, 0.1), (rloo, 1, 0.2), (gae, 0, 0.3)], [rloo, gae],
                     failed=[{"preset": gae, "seed": 1}, {"preset": rloo, "seed": 2}])  # fmt: skip
    new = _saved([(rloo, 1, 0.9), (rloo, 2, 0.5), (grpo, 0, 0.4)], [rloo, grpo], failed=[{"preset": grpo, "seed": 1}])
    new["wall_time_s"] = 2.0
    merged = mod.merge_results(earlier, new)
    assert [(r["preset"], r["seed"], r["gain"]) for r in merged["runs"]] == [
        (gae, 0, 0.3), (grpo, 0, 0.4), (rloo, 0, 0.1), (rloo, 1, 0.9), (rloo, 2, 0.5)]  # fmt: skip
    assert list(merged["presets"]) == [grpo, rloo, gae]  # PRESETS order; rloo's aggregate is the new one
    assert merged["presets"][rloo] == {"seeds": [1, 2]} and merged["earlier_presets"] == [gae]
    # a failure whose run has a record now is gone; the others stay
    assert merged["failed"] == [{"preset": gae, "seed": 1}, {"preset": grpo, "seed": 1}]
    assert merged["wall_time_s"] == 2.0
    assert mod.merge_results(merged, merged) == merged  # idempotent
    with pytest.raises(ValueError, match="seeds=3, this run 5"):
        mod.merge_results(earlier, _saved([], [], seeds=5))
    with pytest.raises(ValueError, match="not an estimators.py one"):
        mod.merge_results({"paper_effect": {}}, new)


def test_an_out_folder_of_another_design_or_contradicting_options_are_refused_before_any_run(tmp_path, capsys):
    mod = _module()
    (tmp_path / "results.json").write_text(json.dumps(_saved([], [], seeds=5)))
    assert mod.main(["--presets", "quickstart_math_rloo", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)]) == 2
    assert "seeds=5" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    assert mod.main(["--rerun", "--finished-only", "--out", str(tmp_path / "o")]) == 2
    assert "pick one" in capsys.readouterr().err and not (tmp_path / "o").exists()


TINY = ["models.shared.name_or_path=tiny-llama", "rollout.batch_size=2", "rollout.group_size=2",
        "rollout.max_new_tokens=10", "eval.size=2", "eval.k=2", "env.data_options.size=8", "run.save_samples=false",
        "run.tensorboard=false", "run.plot=false"]  # fmt: skip


def _script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.mark.slow
def test_the_script_trains_two_presets_and_ranks_them_on_a_leaderboard(tmp_path):
    args = ["--presets", "quickstart_math_rloo", "quickstart_math_gae", "--seeds", "1", "--iterations", "1",
            "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--jobs", "2", *TINY]  # fmt: skip
    done = _script(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout)
    assert (
        set(printed["presets"]) == {"quickstart_math_rloo", "quickstart_math_gae"} and printed["failed"] == []
    )
    out = tmp_path / "out"
    board = json.loads((out / "leaderboard.json").read_text())["math-other"]
    rows = {r["label"]: r for r in board["rows"]}
    assert set(rows) == {"quickstart_math_rloo", "quickstart_math_gae"} and board["k"] == 2
    for preset, row in rows.items():
        run = tmp_path / "runs" / preset / "seed_0"
        metrics = read_metrics(run / "metrics.jsonl")  # the numbers on the page are this run's
        record = json.loads((run / "benchmark_run.json").read_text())
        assert row["run_dir"] == f"results/{preset}"  # a relative path, not this machine's
        assert row["run_metrics"]["held-out gain avg@2"]["value"] == metrics[-1]["val/avg@2_gain"]
        assert row["run_metrics"]["grad norm shared"]["value"] == pytest.approx(
            metrics[-1]["loss/shared/grad_norm"]
        )
        assert row["run_metrics"]["wall time min"]["value"] == pytest.approx(record["wall_time_s"] / 60)
        assert row["avg@k"]["reasoning_gym/basic_arithmetic"] == pytest.approx(metrics[-1]["val/avg@2"])
        assert record["wall_time_s"] > 0 and not (run / "checkpoints").exists()  # deleted after the run
    assert math.isfinite(rows["quickstart_math_gae"]["run_metrics"]["value loss shared last"]["value"])
    assert "value loss shared last" not in rows["quickstart_math_rloo"]["run_metrics"]
    page = (out / "leaderboard.md").read_text()
    wall = rows["quickstart_math_gae"]["run_metrics"]["wall time min"]["value"]
    assert "run metrics" in page and f"{wall:.3g}" in page and page.count("quickstart_math_rloo") == 3
    assert 'id="runs-math-other"' in (out / "leaderboard.html").read_text()
    assert str(tmp_path) not in page

    again = _script(*args)  # finished runs are reused: same records, nothing retrained
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["presets"] == printed["presets"] and "done " not in again.stderr

    # one preset again into the same --out: its folder is regenerated, the other preset's stays on the leaderboard
    one = _script("--presets", "quickstart_math_rloo", *args[3:])
    assert one.returncode == 0, one.stderr[-3000:]
    assert set(json.loads(one.stdout)["presets"]) == {"quickstart_math_rloo"}
    assert (out / "results" / "quickstart_math_gae" / "summary.json").is_file()
    board = json.loads((out / "leaderboard.json").read_text())["math-other"]
    assert {r["label"] for r in board["rows"]} == {"quickstart_math_rloo", "quickstart_math_gae"}
    saved = json.loads((out / "results.json").read_text())  # and results.json keeps the other preset's runs
    assert [(r["preset"], r["seed"]) for r in saved["runs"]] == [("quickstart_math_gae", 0), ("quickstart_math_rloo", 0)]
    assert list(saved["presets"]) == ["quickstart_math_rloo", "quickstart_math_gae"]
    assert saved["earlier_presets"] == ["quickstart_math_gae"]

    # --finished-only trains nothing: a run without its record is listed as missing, its earlier record is kept
    (tmp_path / "runs" / "quickstart_math_gae" / "seed_0" / "benchmark_run.json").unlink()
    partial = _script(*args, "--finished-only")
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert json.loads(partial.stdout)["missing"] == [{"preset": "quickstart_math_gae", "seed": 0}]
    assert "done " not in partial.stderr
    assert json.loads((out / "results.json").read_text())["runs"] == saved["runs"]


@pytest.mark.slow
def test_a_lora_agents_run_is_recorded_and_a_missing_record_is_written_from_the_finished_run(tmp_path):
    """Adapter model ids (``base:solver``) in the record's agent models (a KeyError once lost six finished runs'
    records); ``--record-finished`` writes the record of a finished run from its directory without training it
    again, with the measures only the training process had left out."""
    tiny = ["models.base.name_or_path=tiny-llama", *TINY[1:]]
    args = ["--presets", "quickstart_math_lora_agents", "--seeds", "1", "--iterations", "1",
            "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), *tiny]  # fmt: skip
    done = _script(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "quickstart_math_lora_agents" / "seed_0"
    first = json.loads((run / "benchmark_run.json").read_text())
    assert first["agent_models"] == {"solver": "tiny-llama", "verifier": "tiny-llama"} and first["peak_rss_gb"] > 0
    (run / "benchmark_run.json").unlink()
    again = _script(*args, "--record-finished")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "done " not in again.stderr  # nothing retrained
    second = json.loads((run / "benchmark_run.json").read_text())
    assert second["recorded_after_the_run"] is True and second["peak_rss_gb"] is None and second["load_start"] is None
    for key in ("gain", "initial", "final", "final_scores", "agent_grad_norm", "agent_models"):
        assert second[key] == first[key]
    summary = json.loads((run / "summary.json").read_text())
    assert second["wall_time_s"] == round(summary["wall_time_s"], 1)
    assert json.loads(again.stdout)["failed"] == []


@pytest.mark.slow
def test_the_script_refuses_an_unknown_preset_with_one_line(tmp_path):
    done = _script(
        "--presets", "quickstart_math_nope", "--out", str(tmp_path / "out"), "--runs", str(tmp_path)
    )
    assert done.returncode == 2 and done.stderr.startswith("estimators.py: config 'quickstart_math_nope'")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_overrides_after_the_preset_list_are_overrides():
    args = _module().parse_args(
        ["--presets", "quickstart_math_rloo", "algorithm.grouping=prompt_agent", "--seeds", "2"]
    )
    assert args.presets == ["quickstart_math_rloo"] and args.overrides == ["algorithm.grouping=prompt_agent"]
    assert args.seeds == 2 and _module().parse_args([]).presets == list(_module().PRESETS)


def test_a_run_is_the_same_whichever_spelling_of_its_directory(tmp_path, monkeypatch):
    """A finished run recorded with ``--runs /abs/runs`` is reused by ``--runs runs`` from the same directory (and
    the reverse); another directory, seed or override is another run."""
    monkeypatch.chdir(tmp_path)
    bench = _module()
    key = {"preset": "quickstart_math", "seed": 2000, "overrides": ["seed=2000", f"run.dir={tmp_path}/runs/q/seed_2000"]}
    relative = {**key, "overrides": ["seed=2000", "run.dir=runs/q/seed_2000"]}
    assert bench.same_job(key, relative) and bench.same_job(relative, key)
    assert not bench.same_job(key, {**relative, "overrides": ["seed=2000", "run.dir=runs/other/seed_2000"]})
    assert not bench.same_job(key, {**key, "seed": 2001}) and not bench.same_job(None, key)
