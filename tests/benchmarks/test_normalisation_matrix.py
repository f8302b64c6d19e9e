"""benchmarks/normalisation_matrix/run.py: the protocol's statistics from their definitions (paired t, Holm, the
verdicts) on hand-built tables, the arms as the protocol names them, and the outcomes of fake run records."""

from __future__ import annotations

import math

import pytest

from helpers.scripts import load_script

nm = load_script("benchmarks/normalisation_matrix/run.py")


def test_the_arms_are_the_protocols_presets():
    """Each arm's preset resolves to its cell: per-agent grouping or not, units, scale (an estimator's own defaults
    where the preset names only the estimator, e.g. ``grpo_step`` = global grouping over calls), and differs from
    its setting's A-C preset in nothing else (but its run name and directory; PROTOCOL.md "Arms")."""
    from drmas_train.algorithm.advantages import DEFAULT_GROUPING
    from drmas_train.algorithm.grouping import cell, resolve_scale
    from drmas_train.run.config import list_presets, load_config, to_yaml

    assert set(nm.SETTINGS) == {"math", "game"}
    for setting, arms in nm.SETTINGS.items():
        assert len(arms) == 8 and set(arms.values()) <= set(list_presets())
        base = load_config(arms["A-C"])  # the setting's own preset; the other arms differ only in the cell
        for arm, preset in arms.items():
            cfg = load_config(preset)
            alg = cfg.algorithm
            per_agent, units = cell(alg.grouping or DEFAULT_GROUPING[alg.estimator], alg.units)
            parts = arm.split("-")
            expected_scale = {"mean": "mean", "bstd": "batch_std"}.get(parts[2] if len(parts) > 2 else "", "std")
            assert (per_agent, units, resolve_scale(alg.scale, alg.norm_by_std)) == (
                parts[0] == "A", {"T": "trajectory", "C": "call"}[parts[1]], expected_scale), (setting, arm)
            cfg.algorithm, cfg.run.dir, cfg.run.name = base.algorithm, base.run.dir, base.run.name  # only the cell differs
            assert to_yaml(cfg) == to_yaml(base), (setting, arm)
        for x, y in [*nm.PRIMARY.values(), *nm.SCALE.values()]:
            assert x in arms and y in arms


def test_paired_t_from_the_definition():
    t = nm.paired_t([0.1, 0.2, 0.3])
    se = 0.1 / math.sqrt(3)
    assert t["mean"] == pytest.approx(0.2) and t["stderr"] == pytest.approx(se) and t["n"] == 3
    assert t["t"] == pytest.approx(0.2 / se)
    # Student's t with 2 degrees of freedom: two-sided p = 1 - t / sqrt(t^2 + 2)
    assert t["p"] == pytest.approx(1 - t["t"] / math.sqrt(t["t"] ** 2 + 2))
    assert nm.paired_t([0.3])["p"] is None
    assert nm.paired_t([0.1, 0.1])["p"] == 0.0 and nm.paired_t([0.0, 0.0])["p"] == 1.0


def test_holm_adjusts_in_order_and_keeps_monotone():
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06 (monotone)
    assert nm.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert nm.holm([0.2, None, 0.01]) == [pytest.approx(0.2), None, pytest.approx(0.02)]  # m = 2
    assert nm.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def _table():
    g_t, g_c, a_t = [0.40, 0.50, 0.45], [0.42, 0.47, 0.44], [0.41, 0.52, 0.43]
    a_c = [c + d for c, d in zip(g_c, [0.10, 0.11, 0.12], strict=True)]
    out = {}
    for i, s in enumerate((2000, 2001, 2002)):
        out[s] = {"G-T": g_t[i], "G-C": g_c[i], "A-T": a_t[i], "A-C": a_c[i],
                  "A-C-mean": a_c[i], "A-C-bstd": a_c[i] - 0.01 * (i + 1), "A-T-mean": a_t[i], "A-T-bstd": a_t[i]}  # fmt: skip
    return out


def test_family_verdicts_on_a_hand_built_table():
    primary = nm.family(_table(), nm.PRIMARY)
    call = primary["grouping | call"]  # d = 0.10, 0.11, 0.12: t = 0.11 / (0.01 / sqrt 3) on 2 df
    t = 0.11 / (0.01 / math.sqrt(3))
    p = 1 - t / math.sqrt(t * t + 2)
    assert call["t"] == pytest.approx(t) and call["p"] == pytest.approx(p)
    assert call["p_holm"] == pytest.approx(4 * p) and call["verdict"] == "moves the result (+)"
    units = primary["units | per-agent"]  # d = 0.11, 0.06, 0.13: |mean| > 2 SE, p_holm = 3 p > 0.05
    assert units["mean"] == pytest.approx(0.1) and units["p_holm"] == pytest.approx(3 * units["p"])
    assert units["verdict"] == "nominal only" and units["p_holm"] > 0.05
    assert primary["grouping | trajectory"]["verdict"] == "not distinguishable at n = 3"
    assert primary["grouping | trajectory"]["detectable"] == pytest.approx(2 * primary["grouping | trajectory"]["stderr"])
    scale = nm.family(_table(), nm.SCALE)
    assert scale["A-C-mean - A-C"]["verdict"] == "not distinguishable at n = 3"  # all zero: t = 0, p = 1
    verdict = nm.setting_verdict(primary, scale)
    assert verdict["grouping moves the result"] and not verdict["units move the result"]
    assert "units | per-agent" in verdict["nominal only"] and "sentence" not in verdict
    assert nm.extension_due(primary)
    desc = nm.descriptive(_table())
    inter = desc["interaction (A-C - A-T) - (G-C - G-T)"]
    assert inter["mean"] == pytest.approx(sum((a - b) - (c - d) for a, b, c, d in
                                              ((0.52, 0.41, 0.42, 0.40), (0.58, 0.52, 0.47, 0.50),
                                               (0.56, 0.43, 0.44, 0.45))) / 3)  # fmt: skip


def test_nothing_moves_says_so_plainly():
    flat = {s: {a: 0.4 + 0.01 * (s - 2000) * (j % 2) for j, a in enumerate(nm.SETTINGS["math"])} for s in (2000, 2001, 2002)}
    primary, scale = nm.family(flat, nm.PRIMARY), nm.family(flat, nm.SCALE)
    verdict = nm.setting_verdict(primary, scale)
    assert verdict["sentence"].startswith("no contrast moves the held-out outcome at n = 3 seeds")
    assert not nm.extension_due(primary)


def test_role_spikes_and_run_secondary():
    rows = [{"iteration": 0}] + [
        {"iteration": i, "agent/solver/grad_norm": 1.0, "agent/solver/grad_norm_max": mx,
         "loss/shared/grad_norm": 1.0, "loss/shared/grad_norm_max": mx,
         "adv/solver/prop43_ratio": f, "adv/solver/second_moment": 1.0}
        for i, (mx, f) in enumerate([(1.2, 1.0), (3.5, 2.0), (2.9, float("nan"))], start=1)]  # fmt: skip
    assert nm.role_spikes(rows, "solver") == 1  # 3.5 > 3 x median 1.0; 2.9 is not
    sec = nm.run_secondary(rows)
    assert sec["roles"]["solver"]["prop43"] == [1.0, 2.0] and sec["roles"]["solver"]["spikes"] == 1
    assert sec["models"]["shared"]["spikes"] == 1
    pooled = nm.arm_secondary([sec, sec])
    assert pooled["roles"]["solver"] == {"prop43_mean": 1.5, "prop43_max": 2.0, "second_moment_mean": 1.0, "spikes": 2}


def test_setting_outcomes_pair_by_seed_and_list_what_is_pending():
    arms = nm.SETTINGS["math"]
    table = _table()
    runs = []
    for s, row in table.items():
        for arm, gain in row.items():
            if s == 2002 and arm == "A-T":
                continue  # not finished yet
            runs.append({"preset": arms[arm], "seed": s, "gain": gain, "gain_stderr": 0.05,
                         "final_scores": {"t0": gain, "t1": gain / 2}, "wall_time_s": 600.0, "peak_rss_gb": 6.0,
                         "load_start": 1.0, "load_end": 1.5, "run_dir": f"r/{arm}/{s}"})  # fmt: skip
    secondary = {r["run_dir"]: {"roles": {}, "models": {}} for r in runs}
    o = nm.setting_outcomes(arms, runs, secondary)
    assert o["pending"] == ["A-T seed 2002"]
    assert o["primary"]["grouping | trajectory"]["seeds"] == [2000, 2001]
    assert o["primary"]["grouping | call"]["n"] == 3
    per_task = o["per_task"]["grouping | call"]  # pooled over 3 seeds x 2 tasks
    assert per_task["n"] == 6 and per_task["mean"] == pytest.approx(0.11 * 1.5 / 2)
    assert o["arms"]["A-T"]["gain"]["n"] == 2


def test_before_three_seeds_there_is_no_verdict_yet():
    one = {2000: {"G-T": 0.375, "G-C": 0.320, "A-C": 0.234}}
    verdict = nm.setting_verdict(nm.family(one, nm.PRIMARY), nm.family(one, nm.SCALE))
    assert verdict["sentence"] == "no verdict yet: the contrasts have n = 1 seed(s) so far; the protocol's verdict uses n = 3"


def test_holm_runs_across_the_settings_of_a_family():
    """PROTOCOL.md: the primary family is 4 contrasts per setting, 8 in all: Holm over both settings' p-values. The
    same table in two settings doubles m, so 'grouping | call' (raw p ~ 0.0027) needs 8 p instead of 4 p."""

    def outcome(table):
        primary, scale = nm.family(table, nm.PRIMARY), nm.family(table, nm.SCALE)
        return {"primary": primary, "scale": scale, "verdict": nm.setting_verdict(primary, scale),
                "extension_due": nm.extension_due(primary)}  # fmt: skip

    one = {"math": outcome(_table())}
    before = {n: r["p_holm"] for n, r in one["math"]["primary"].items()}
    nm.holm_across(one)
    assert {n: r["p_holm"] for n, r in one["math"]["primary"].items()} == before  # one setting: unchanged
    two = {"math": outcome(_table()), "game": outcome(_table())}
    nm.holm_across(two)
    raw = [r["p"] for o in two.values() for r in o["primary"].values()]
    assert [r["p_holm"] for o in two.values() for r in o["primary"].values()] == pytest.approx(nm.holm(raw))
    call = two["game"]["primary"]["grouping | call"]
    assert call["p_holm"] == pytest.approx(8 * call["p"])  # the smallest p (twice): 8 p, then max(8 p, 7 p)
    assert call["verdict"] == ("moves the result (+)" if 8 * call["p"] <= 0.05 else "nominal only")
    assert two["math"]["verdict"]["grouping moves the result"] == call["verdict"].startswith("moves")
