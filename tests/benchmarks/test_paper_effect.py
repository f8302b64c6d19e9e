"""benchmarks/paper_effect/run.py: the pre-registered protocol's outcomes (golden numbers from PROTOCOL.md's
definitions) and one smoke run of its run loop on a tiny model."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from drmas_train.run.config import list_presets, load_config
from helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


def _module():
    return load_script("benchmarks/paper_effect/run.py", "paper_effect_run")


def test_the_protocol_names_the_runner_constants():
    text = (ROOT / "benchmarks" / "paper_effect" / "PROTOCOL.md").read_text()
    mod = _module()
    assert mod.SEEDS == 3 and mod.FIRST_SEED == 1000 and "Seeds **1000, 1001, 1002**" in text
    assert "exceeds 3× the median" in text and mod.SPIKE_FACTOR == 3.0
    assert "`mean(d) > 2 SE`" in text and mod.VERDICT_SE == 2.0
    for setting, (dr, gr) in mod.SETTINGS.items():
        assert f"| `{setting}` | `{dr}` | `{gr}` |" in text


def test_the_math_arms_exist_and_differ_only_in_the_estimator():
    mod = _module()
    for setting, (dr, gr) in mod.SETTINGS.items():
        if setting == "search_team" and gr not in list_presets():
            continue  # the search twin arrives with the search quickstart (issue 26)
        a, b = load_config(dr), load_config(gr)
        assert (a.algorithm.estimator, b.algorithm.estimator) == ("drmas", "grpo")
        assert a.models == b.models and a.agents == b.agents and a.env == b.env and a.rollout == b.rollout
        assert a.optim == b.optim and a.eval == b.eval and a.seed == b.seed


def test_mean_stderr_and_verdict_follow_the_protocol():
    mod = _module()
    est = mod.mean_stderr([0.1, 0.2, 0.3])
    assert est["mean"] == pytest.approx(0.2) and est["n"] == 3
    assert est["stderr"] == pytest.approx(0.1 / math.sqrt(3))  # sample std 0.1 (ddof 1)
    assert mod.mean_stderr([0.5])["stderr"] is None
    with pytest.raises(ValueError, match="at least one"):
        mod.mean_stderr([])
    assert mod.verdict({"mean": 0.21, "stderr": 0.1, "n": 3}) == "the paper's direction holds"
    assert mod.verdict({"mean": 0.2, "stderr": 0.1, "n": 3}) == "not distinguishable at n = 3 seeds"  # not > 2 SE  # fmt: skip
    assert mod.verdict({"mean": -0.21, "stderr": 0.1, "n": 3}) == "reversed"
    assert mod.verdict({"mean": 0.9, "stderr": None, "n": 1}) == "not distinguishable at n = 1 seed"


def test_spikes_are_iterations_past_three_times_the_median_mean_norm():
    mod = _module()
    rows = [{"iteration": i, "loss/m/grad_norm": g, "loss/m/grad_norm_max": gm}
            for i, (g, gm) in enumerate([(1.0, 2.9), (2.0, 6.1), (3.0, 6.0), (1.5, 9.0)], start=1)]  # fmt: skip
    # median of the means: 1.75 -> bar 5.25: iterations 2 (6.1), 3 (6.0) and 4 (9.0) spike
    assert mod.spike_count(rows, "m") == 3
    assert mod.spike_count(rows, "m", factor=4.0) == 1  # bar 7.0
    assert mod.spike_count(rows, "other") == 0


def _rows(agent_norms, moments):
    return [{"iteration": 0}] + [
        {"iteration": i + 1, "loss/shared/grad_norm": sum(g), "loss/shared/grad_norm_max": sum(g),
         **{f"agent/{a}/grad_norm": x for a, x in zip(("solver", "verifier"), g, strict=True)},
         **{f"adv/{a}/second_moment": x for a, x in zip(("solver", "verifier"), m, strict=True)}}
        for i, (g, m) in enumerate(zip(agent_norms, moments, strict=True))
    ]  # fmt: skip


def test_gradient_health_and_prop43_ratios_from_metrics_rows():
    mod = _module()
    dr = mod.gradient_health(_rows([(1.0, 1.0), (1.0, 3.0)], [(1.0, 1.0), (1.0, 1.0)]))
    gr = mod.gradient_health(_rows([(2.0, 1.0), (2.0, 1.0)], [(4.0, 0.5), (4.0, 0.5)]))
    assert dr["agents"]["verifier"]["max_over_median"] == pytest.approx(3.0 / 2.0)
    assert dr["agents"]["verifier"]["grad_norm_sq_mean"] == pytest.approx(5.0)  # (1 + 9) / 2
    assert dr["models"]["shared"] == {"mean": 3.0, "median": 3.0, "max": 4.0, "spikes": 0}
    ratio = mod.prop43([dr], [gr])
    assert ratio["solver"] == {"predicted": pytest.approx(4.0), "measured": pytest.approx(4.0)}
    assert ratio["verifier"] == {"predicted": pytest.approx(0.5), "measured": pytest.approx(1.0 / 5.0)}


def test_setting_outcomes_pair_the_seeds():
    mod = _module()

    def run(preset, seed, gain, scores):
        return {"preset": preset, "seed": seed, "gain": gain, "gain_stderr": 0.05, "final_scores": scores,
                "wall_time_s": 10.0, "peak_rss_gb": 1.0, "load_start": 1.0, "load_end": 1.0,
                "run_dir": f"{preset}/{seed}"}  # fmt: skip

    health = {f"{p}/{s}": {"models": {"m": {"spikes": s - 999}}, "agents": {}} for p in "dg" for s in (1000, 1001, 1002)}  # fmt: skip
    dr = [run("d", 1000, 0.3, {"t1": 1.0, "t2": 0.5}), run("d", 1001, 0.2, {"t1": 0.0}), run("d", 1002, 0.1, {})]  # fmt: skip
    gr = [run("g", 1000, 0.1, {"t1": 0.5, "t2": 0.5}), run("g", 1001, 0.1, {"t1": 0.25})]
    out = mod.setting_outcomes(dr, gr, health)
    assert out["seeds"] == [1000, 1001] and out["unpaired_seeds"] == [1002]
    d = [0.2, 0.1]
    assert out["gain_difference"]["mean"] == pytest.approx(0.15)
    assert out["gain_difference"]["stderr"] == pytest.approx(statistics.stdev(d) / math.sqrt(2))
    assert out["detectable_difference"] == pytest.approx(2 * statistics.stdev(d) / math.sqrt(2))
    assert out["verdict"] == "the paper's direction holds"  # 0.15 > 2 x 0.05
    assert out["per_task_difference"]["mean"] == pytest.approx((0.5 + 0.0 - 0.25) / 3)
    assert out["arms"]["drmas"]["spikes"] == 1 + 2 and out["arms"]["grpo"]["spikes"] == 3
    with pytest.raises(ValueError, match="no seed has both arms"):
        mod.setting_outcomes(dr[:1], gr[1:], health)


def test_the_plot_pairs_each_seeds_gains_and_places_prop43_points(tmp_path):
    """plot_outcomes: per setting, one line per seed from its GRPO gain to its Dr. MAS gain, and one Prop. 4.3 point
    per agent at (predicted, measured); a setting with an error is left out."""
    mod = _module()

    def runs(gains):
        return [{"seed": 1000 + i, "gain": g} for i, g in enumerate(gains)]

    outcomes = {
        "a": {"arms": {"drmas": {"runs": runs([0.3, 0.2]), "gain": {"mean": 0.25, "stderr": 0.05}},
                       "grpo": {"runs": runs([0.1, 0.15]), "gain": {"mean": 0.125, "stderr": 0.025}}},
              "gain_difference": {"mean": 0.125, "stderr": 0.075, "n": 2}, "verdict": "not distinguishable at n = 2 seeds",
              "prop43": {"x": {"predicted": 1.5, "measured": 1.2}, "y": {"predicted": None, "measured": 1.0}}},
        "b": {"error": "no seed has both arms"},
    }  # fmt: skip
    path = tmp_path / "pe.png"
    fig = mod.plot_outcomes(outcomes, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    top, bottom = fig.axes
    pairs = [list(line.get_ydata()) for line in top.get_lines() if line.get_label().startswith("seed")]
    assert pairs == [[0.1, 0.3], [0.15, 0.2]]
    points = [(line.get_xdata()[0], line.get_ydata()[0]) for line in bottom.get_lines() if line.get_marker() == "o"]
    assert points == [(1.5, 1.2)]  # the agent without a prediction is not placed


def _results(settings, protocol=True, seeds=3):
    """A results.json as run.py writes it: per setting its two presets' aggregates, one run each and its outcome."""
    mod = _module()
    presets = [p for s in settings for p in mod.SETTINGS[s]]
    return {"presets": {p: {"seeds": [1000]} for p in presets}, "failed": [{"preset": presets[-1], "seed": 1002}],
            "seeds": seeds, "first_seed": 1000, "iterations": None, "overrides": [], "wall_time_s": 1.0,
            "runs": [{"preset": p, "seed": 1000, "gain": float(i)} for i, p in enumerate(presets)],
            "paper_effect": {"protocol": protocol, "settings": {s: {"verdict": f"v-{s}"} for s in settings}}}  # fmt: skip


def test_merging_keeps_the_other_settings_and_replaces_the_rerun_one():
    mod = _module()
    earlier = _results(["search_team", "lora_agents", "math_nonsharing"])
    new = _results(["math_nonsharing"], protocol=True)
    new["runs"][0]["gain"] = 9.0
    new["wall_time_s"] = 2.0
    merged = mod.merge_results(earlier, new, ["math_nonsharing"])
    assert list(merged["paper_effect"]["settings"]) == ["math_nonsharing", "search_team", "lora_agents"]  # SETTINGS order
    assert merged["earlier_settings"] == ["lora_agents", "search_team"]
    ns = mod.SETTINGS["math_nonsharing"]
    assert [r["gain"] for r in merged["runs"] if r["preset"] in ns] == [9.0, 1.0]  # this run's, not the earlier one's
    assert len(merged["runs"]) == 6 and list(merged["presets"]) == [p for s in mod.SETTINGS.values() for p in s]
    # the earlier failure of a re-run preset is gone, the new one is kept
    assert merged["failed"] == [{"preset": ns[1], "seed": 1002}]
    assert merged["wall_time_s"] == 2.0 and merged["paper_effect"]["protocol"] is True
    # one non-protocol side makes the whole file non-protocol
    assert mod.merge_results(earlier, _results(["math_nonsharing"], protocol=False), ["math_nonsharing"])[
        "paper_effect"]["protocol"] is False  # fmt: skip


def test_an_out_folder_of_another_design_is_refused_before_any_run(tmp_path, capsys):
    mod = _module()
    (tmp_path / "results.json").write_text(json.dumps(_results(["search_team"], seeds=5)))
    code = mod.main(["--settings", "math_nonsharing", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)])
    assert code == 2 and "seeds=5" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing ran
    (tmp_path / "results.json").write_text(json.dumps({"presets": {}, "runs": []}))
    assert mod.main(["--settings", "math_nonsharing", "--out", str(tmp_path)]) == 2
    assert "no 'paper_effect'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="iterations=None, this run 2"):
        mod.merge_results(_results(["search_team"]), {**_results(["math_nonsharing"]), "iterations": 2}, ["math_nonsharing"])


@pytest.mark.slow
def test_a_smoke_run_of_one_setting_writes_its_outcomes(tmp_path, capsys):
    mod = _module()
    tiny = ["models.solver_model.name_or_path=tiny-llama", "models.verifier_model.name_or_path=tiny-llama",
            "rollout.batch_size=2", "rollout.group_size=2", "rollout.max_new_tokens=8", "eval.size=3", "eval.k=2",
            "eval.every=1", "env.data_options.size=8", "run.save_samples=false", "run.tensorboard=false",
            "run.plot=false"]  # fmt: skip
    code = mod.main(["--settings", "math_nonsharing", "--seeds", "1", "--iterations", "1",
                     "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), *tiny])  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["protocol"] is False and printed["settings"]["math_nonsharing"]["seeds"] == [1000]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())["paper_effect"]["settings"]["math_nonsharing"]  # fmt: skip
    runs = saved["arms"]["drmas"]["runs"]
    assert [r["seed"] for r in runs] == [1000] and saved["arms"]["grpo"]["runs"][0]["seed"] == 1000
    # both models of the non-sharing team were updated and their health recorded
    assert set(runs[0]["gradient_health"]["models"]) == {"solver_model", "verifier_model"}
    assert saved["verdict"] == "not distinguishable at n = 1 seed"  # one seed: no standard error
    assert (tmp_path / "out" / "leaderboard.md").is_file() and (tmp_path / "out" / "paper_effect.png").is_file()
