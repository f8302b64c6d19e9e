"""Dr. MAS vs GRPO where the agents differ: the pre-registered benchmark of ``benchmarks/paper_effect/PROTOCOL.md``.

Three settings (two separate models, the search team, LoRA adapters per agent), each a pair of presets that differ
only in ``algorithm.estimator``, trained for the protocol's seeds (1000, 1001, 1002) by the run loop of
``benchmarks/learning/estimators.py`` (one real ``drmas train`` per preset x seed, reused when already finished).
Then the protocol's outcomes per setting:

* the primary outcome: the paired difference of held-out gains ``d_s = gain_drmas(s) - gain_grpo(s)``, mean ± SE
  over seeds (sample std, ddof 1, / sqrt(n)), and its verdict (:func:`verdict`, thresholds at 2 SE);
* the per-task paired difference of the final held-out avg@k pooled over seeds (secondary);
* per model: gradient norm mean / median / max over iterations and the spike count (:func:`spike_count`); per agent:
  the part of the gradient and its max/median;
* Prop. 4.3 (Dr. MAS arXiv 2602.08847): per agent, the GRPO/Dr. MAS ratio of the advantage second moment (the
  prediction) and of the squared per-agent gradient norm (the measurement);
* wall time, peak RSS and load per run.

Writes ``results.json`` (every run's record plus ``paper_effect``: the outcomes above), the leaderboard of the six
arms, ``paper_effect.png`` (:func:`plot_outcomes`), and prints one JSON object. Exit codes as ``estimators.py``:
0 ok, 1 a run failed, 2 bad arguments.

    python benchmarks/paper_effect/run.py                         # the protocol: 18 runs, 8-11 h on 2 cores
    python benchmarks/paper_effect/run.py --jobs 2                # two at a time on an idle 2-core machine
    python benchmarks/paper_effect/run.py --settings math_nonsharing --iterations 1 --out runs/pe_smoke \\
        models.solver_model.name_or_path=tiny-llama models.verifier_model.name_or_path=tiny-llama  # a smoke run

Settings measured by separate invocations into the same ``--out`` end in one ``results.json`` (:func:`merge_results`):
a setting run again replaces its earlier runs and outcomes, the others are kept. An ``--out`` whose ``results.json``
used other seeds, iterations or overrides is refused (exit 2) before any run starts.

Anything but the defaults (``--seeds``, ``--first-seed``, ``--iterations``, overrides) is not the protocol; the
printed JSON then says ``"protocol": false``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: setting -> (Dr. MAS preset, GRPO preset); PROTOCOL.md "Arms"
SETTINGS: dict[str, tuple[str, str]] = {
    "math_nonsharing": ("quickstart_math_nonsharing", "quickstart_math_nonsharing_grpo"),
    "search_team": ("quickstart_search", "quickstart_search_grpo"),
    "lora_agents": ("quickstart_math_lora_agents", "quickstart_math_lora_agents_grpo"),
}
FIRST_SEED, SEEDS = 1000, 3  # PROTOCOL.md "Seeds and runs"
SPIKE_FACTOR = 3.0  # PROTOCOL.md "Secondary outcomes" 2
VERDICT_SE = 2.0  # PROTOCOL.md "Verdict"


ESTIMATORS = HERE.parent / "learning" / "estimators.py"


def mean_stderr(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "stderr", "n"}``: the sample mean and its standard error (sample std, ddof 1, / sqrt(n));
    stderr is None for fewer than 2 values.

    Raises:
        ValueError: no values.
    """
    if not values:
        raise ValueError("mean_stderr needs at least one value")
    n = len(values)
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else None
    return {"mean": statistics.fmean(values), "stderr": se, "n": n}


def verdict(estimate: Mapping[str, Any]) -> str:
    """PROTOCOL.md's verdict on the paired difference ``d = gain_drmas - gain_grpo`` (``mean_stderr`` of it):
    ``holds`` if mean > 2 SE, ``reversed`` if mean < -2 SE, else ``not distinguishable at n = <n> seeds``
    (also with one seed, whose SE is unknown)."""
    mean, se, n = estimate["mean"], estimate["stderr"], estimate["n"]
    if se is not None and mean > VERDICT_SE * se:
        return "the paper's direction holds"
    if se is not None and mean < -VERDICT_SE * se:
        return "reversed"
    return f"not distinguishable at n = {n} seed{'s' if n != 1 else ''}"


def spike_count(rows: Sequence[Mapping[str, Any]], model: str, factor: float = SPIKE_FACTOR, *,
                namespace: str = "loss") -> int:  # fmt: skip
    """Iterations whose ``loss/<model>/grad_norm_max`` (the largest optimizer-step gradient norm of the iteration)
    exceeds ``factor`` x the median over the run's iterations of ``loss/<model>/grad_norm`` (PROTOCOL.md).
    ``namespace="agent"`` counts an agent's spikes the same way (``agent/<agent>/grad_norm[_max]``, its part of its
    model's gradient)."""
    key = f"{namespace}/{model}/grad_norm"
    means = [r[key] for r in rows if _finite(r.get(key))]
    if not means:
        return 0
    bar = factor * statistics.median(means)
    return sum(1 for r in rows if _finite(r.get(f"{key}_max")) and r[f"{key}_max"] > bar)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def series(rows: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """``key``'s finite values over the training iterations (``iteration`` > 0) of ``metrics.jsonl`` rows."""
    return [float(r[key]) for r in rows if r.get("iteration", 0) > 0 and _finite(r.get(key))]


def gradient_health(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per model: mean / median / max over iterations of ``loss/<model>/grad_norm`` and the spike count; per agent:
    mean / median / max of ``agent/<agent>/grad_norm``, its max/median ratio, the mean of its square, and the mean
    of ``adv/<agent>/second_moment``."""
    models = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("loss/") and k.endswith("/grad_norm")})
    agents = sorted({k.split("/")[1] for r in rows for k in r if k.startswith("agent/") and k.endswith("/grad_norm")})
    out: dict[str, Any] = {"models": {}, "agents": {}}
    for m in models:
        g = series(rows, f"loss/{m}/grad_norm")
        if g:
            out["models"][m] = {"mean": statistics.fmean(g), "median": statistics.median(g), "max": max(g),
                                "spikes": spike_count([r for r in rows if r.get("iteration", 0) > 0], m)}  # fmt: skip
    for a in agents:
        g = series(rows, f"agent/{a}/grad_norm")
        m2 = series(rows, f"adv/{a}/second_moment")
        if g:
            med = statistics.median(g)
            out["agents"][a] = {"mean": statistics.fmean(g), "median": med, "max": max(g),
                                "max_over_median": max(g) / med if med > 0 else None,
                                "grad_norm_sq_mean": statistics.fmean(x * x for x in g),
                                "adv_second_moment_mean": statistics.fmean(m2) if m2 else None}  # fmt: skip
    return out


def prop43(drmas_health: Sequence[Mapping[str, Any]], grpo_health: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per agent, pooled over seeds: ``predicted`` = mean GRPO advantage second moment / mean Dr. MAS one, and
    ``measured`` = mean GRPO squared per-agent gradient norm / mean Dr. MAS one (Prop. 4.3: an agent's
    policy-gradient second moment scales with its advantage second moment); None where a figure is missing or 0."""

    def pooled(healths: Sequence[Mapping[str, Any]], agent: str, key: str) -> float | None:
        vals = [h["agents"][agent][key] for h in healths if agent in h["agents"] and h["agents"][agent][key] is not None]
        return statistics.fmean(vals) if vals else None

    agents = sorted({a for h in [*drmas_health, *grpo_health] for a in h["agents"]})
    out = {}
    for a in agents:
        ratio = {}
        for name, key in (("predicted", "adv_second_moment_mean"), ("measured", "grad_norm_sq_mean")):
            num, den = pooled(grpo_health, a, key), pooled(drmas_health, a, key)
            ratio[name] = num / den if num is not None and den else None
        out[a] = ratio
    return out


def setting_outcomes(drmas_runs: Sequence[Mapping[str, Any]], grpo_runs: Sequence[Mapping[str, Any]],
                     health: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The protocol's outcomes of one setting from its runs' records (``estimators.py``'s ``benchmark_run.json``:
    ``seed``, ``gain``, ``final_scores``, ``wall_time_s``, ``peak_rss_gb``, ``load_start``/``load_end``) and their
    :func:`gradient_health` by ``run_dir``. Seeds are paired; a seed where one arm is missing is left out and listed.

    Raises:
        ValueError: no seed has both arms.
    """
    d_runs, g_runs = {r["seed"]: r for r in drmas_runs}, {r["seed"]: r for r in grpo_runs}
    seeds = sorted(set(d_runs) & set(g_runs))
    if not seeds:
        raise ValueError(f"no seed has both arms (drmas: {sorted(d_runs)}, grpo: {sorted(g_runs)})")
    diff = mean_stderr([d_runs[s]["gain"] - g_runs[s]["gain"] for s in seeds])
    per_task = [d_runs[s]["final_scores"][t] - g_runs[s]["final_scores"][t]
                for s in seeds for t in sorted(d_runs[s]["final_scores"]) if t in g_runs[s]["final_scores"]]  # fmt: skip
    arms = {}
    for name, runs in (("drmas", d_runs), ("grpo", g_runs)):
        arms[name] = {
            "gain": mean_stderr([runs[s]["gain"] for s in seeds]),
            "spikes": sum(sum(m["spikes"] for m in health[runs[s]["run_dir"]]["models"].values()) for s in seeds),
            "runs": [{"seed": s, "gain": runs[s]["gain"], "gain_stderr": runs[s]["gain_stderr"],
                      "wall_time_s": runs[s]["wall_time_s"], "peak_rss_gb": runs[s]["peak_rss_gb"],
                      "load": [runs[s]["load_start"], runs[s]["load_end"]],
                      "gradient_health": health[runs[s]["run_dir"]]} for s in seeds],
        }  # fmt: skip
    return {
        "seeds": seeds,
        "unpaired_seeds": sorted(set(d_runs) ^ set(g_runs)),
        "gain_difference": diff,
        "detectable_difference": VERDICT_SE * diff["stderr"] if diff["stderr"] is not None else None,
        "verdict": verdict(diff),
        "per_task_difference": mean_stderr(per_task) if per_task else None,
        "arms": arms,
        "prop43": prop43([health[d_runs[s]["run_dir"]] for s in seeds], [health[g_runs[s]["run_dir"]] for s in seeds]),
    }


def _estimators() -> Any:
    """``benchmarks/learning/estimators.py`` as a module (its run records and their merging)."""
    spec = importlib.util.spec_from_file_location("drmas_bench_estimators", ESTIMATORS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_mergeable(earlier: Mapping[str, Any], design: Mapping[str, Any]) -> None:
    """Whether ``design`` (this invocation's seeds, first seed, iterations and overrides: ``estimators.py``'s
    ``DESIGN_KEYS``) can join ``earlier`` (a ``results.json``) in one file: checked before any run starts (see
    :func:`merge_results`).

    Raises:
        ValueError: ``earlier`` has no ``paper_effect`` outcomes, or ``estimators.py``'s ``check_mergeable`` refuses
            it (other seeds, iterations or overrides).
    """
    if "paper_effect" not in earlier:
        raise ValueError("the results.json already in --out has no 'paper_effect' outcomes: move it away or pick "
                         "another --out")  # fmt: skip
    _estimators().check_mergeable(earlier, design)


def merge_results(earlier: Mapping[str, Any], new: Mapping[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """``results.json`` of ``new`` (this invocation's, for ``settings``) plus what ``earlier`` (the same folder's
    previous ``results.json``) holds for every other setting: its runs, failures and seed aggregates (merged as
    ``estimators.py``'s ``merge_results`` does, by preset and seed) and its outcomes. So the settings of a protocol
    measured in separate invocations (sessions) end in one file; a setting measured again replaces its outcomes.
    ``paper_effect.protocol`` is true only if both were; ``earlier_settings`` lists the settings kept from
    ``earlier``.

    Raises:
        ValueError: as :func:`check_mergeable`.
    """
    check_mergeable(earlier, new)
    kept = {s: o for s, o in earlier["paper_effect"]["settings"].items() if s not in settings}
    order = [s for s in SETTINGS if s in kept or s in settings]
    merged = _estimators().merge_results(earlier, new)
    merged["presets"] = {p: merged["presets"][p] for s in order for p in SETTINGS[s] if p in merged["presets"]}
    settings_out = {**kept, **new["paper_effect"]["settings"]}
    merged["paper_effect"] = {
        "protocol": bool(earlier["paper_effect"]["protocol"] and new["paper_effect"]["protocol"]),
        "settings": {s: settings_out[s] for s in order},
    }
    merged["earlier_settings"] = sorted(kept)
    return merged


def plot_outcomes(outcomes: Mapping[str, Mapping[str, Any]], path: Path) -> Any:
    """``paper_effect.png``: one column per setting with outcomes. Top: each seed's held-out gain in both arms (a line
    per seed pairs them) and each arm's mean ± SE. Bottom: Prop. 4.3 per agent, the predicted GRPO/Dr. MAS ratio
    (advantage second moment) against the measured one (squared per-agent gradient norm), with the identity line.
    Settings whose outcomes are an ``{"error"}`` are left out. Returns the matplotlib figure (closed, saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [s for s, o in outcomes.items() if "error" not in o]
    fig, axes = plt.subplots(2, max(len(shown), 1), figsize=(4.2 * max(len(shown), 1), 7.5), squeeze=False)
    for col, setting in enumerate(shown):
        o, top, bottom = outcomes[setting], axes[0][col], axes[1][col]
        arms = o["arms"]
        for d_run, g_run in zip(arms["drmas"]["runs"], arms["grpo"]["runs"], strict=True):
            top.plot([0, 1], [g_run["gain"], d_run["gain"]], "o-", color="0.6", label=f"seed {d_run['seed']}")
        for x, name in ((0, "grpo"), (1, "drmas")):
            g = arms[name]["gain"]
            top.errorbar([x + 0.08], [g["mean"]], yerr=[g["stderr"] or 0.0], fmt="s", color="C3", capsize=4)
        d = o["gain_difference"]
        se = f" ± {d['stderr']:.3f}" if d["stderr"] is not None else ""
        top.set(xticks=[0, 1], xticklabels=["GRPO", "Dr. MAS"], xlim=(-0.4, 1.4), ylabel="held-out gain (avg@k)",
                title=f"{setting}\nd = {d['mean']:+.3f}{se}: {o['verdict']}")  # fmt: skip
        top.axhline(0.0, color="0.85", lw=0.8)
        top.title.set_fontsize(9)
        points = [(a, r["predicted"], r["measured"]) for a, r in o["prop43"].items()
                  if r["predicted"] is not None and r["measured"] is not None]  # fmt: skip
        for agent, pred, meas in points:
            bottom.plot([pred], [meas], "o")
            bottom.annotate(agent, (pred, meas), textcoords="offset points", xytext=(4, 4), fontsize=8)
        if points:
            lo = min(min(p[1], p[2]) for p in points) * 0.9
            hi = max(max(p[1], p[2]) for p in points) * 1.1
            bottom.plot([lo, hi], [lo, hi], "--", color="0.6", lw=0.8)
        bottom.set(xlabel="predicted GRPO / Dr. MAS (adv. 2nd moment)", ylabel="measured (grad norm²)",
                   title="Prop. 4.3 per agent, pooled over seeds")  # fmt: skip
        bottom.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS), metavar="SETTING",
                   help=f"settings to run (default all: {', '.join(SETTINGS)})")  # fmt: skip
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds per arm (protocol: {SEEDS})")
    p.add_argument("--first-seed", type=int, default=FIRST_SEED, help=f"first seed (protocol: {FIRST_SEED})")
    p.add_argument("--iterations", type=int, default=None, help="override run.iterations (smoke runs only)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    p.add_argument("--runs", default="runs/paper_effect", help="where the training runs go")
    p.add_argument("--out", default=str(HERE), help="results.json and the leaderboard (default: this folder)")
    p.add_argument("--rerun", action="store_true", help="re-run finished runs instead of reusing their records")
    p.add_argument("--record-finished", action="store_true",
                   help="record runs that finished training without a record (estimators.py --record-finished)")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run (not the protocol)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code (0 ok, 1 a run failed, 2 bad arguments)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    presets = [p for s in args.settings for p in SETTINGS[s]]
    results_path = Path(args.out) / "results.json"
    # the settings measured by an earlier invocation into the same folder (estimators.py keeps their runs, this
    # script their outcomes)
    earlier = json.loads(results_path.read_text()) if results_path.is_file() else None
    if earlier is not None:
        try:
            check_mergeable(earlier, {"seeds": args.seeds, "first_seed": args.first_seed,
                                      "iterations": args.iterations, "overrides": args.overrides})  # fmt: skip
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    protocol = (args.seeds, args.first_seed, args.iterations, args.overrides) == (SEEDS, FIRST_SEED, None, [])
    inner = ["--presets", *presets, "--seeds", str(args.seeds), "--first-seed", str(args.first_seed),
             "--jobs", str(args.jobs), "--threads", "1", "--runs", args.runs, "--out", args.out,
             "--title", "Dr. MAS vs GRPO where the agents differ (benchmarks/paper_effect/PROTOCOL.md)",
             *(["--iterations", str(args.iterations)] if args.iterations is not None else []),
             *(["--rerun"] if args.rerun else []), *(["--record-finished"] if args.record_finished else []),
             *args.overrides]  # fmt: skip
    # its own process (its run loop spawns workers that import it by path); its JSON line goes to stderr, so that
    # stdout carries this script's one JSON object
    proc = subprocess.run([sys.executable, str(ESTIMATORS), *inner], stdout=subprocess.PIPE, text=True, check=False)
    sys.stderr.write(proc.stdout)
    code = proc.returncode
    if code == 2:
        return 2
    from drmas_train.run.metrics_log import read_metrics

    results = json.loads(results_path.read_text())
    runs = results["runs"]
    health = {r["run_dir"]: gradient_health(read_metrics(Path(r["run_dir"]) / "metrics.jsonl")) for r in runs}
    outcomes: dict[str, Any] = {}
    for setting in args.settings:
        dr, gr = SETTINGS[setting]
        try:
            outcomes[setting] = setting_outcomes([r for r in runs if r["preset"] == dr],
                                                 [r for r in runs if r["preset"] == gr], health)  # fmt: skip
        except ValueError as err:
            outcomes[setting] = {"error": str(err)}
    results["paper_effect"] = {"protocol": protocol, "settings": outcomes}
    if earlier is not None:
        results = merge_results(earlier, results, args.settings)
        outcomes = results["paper_effect"]["settings"]
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    plot_outcomes(outcomes, Path(args.out) / "paper_effect.png")
    brief = {s: {k: o.get(k) for k in ("seeds", "gain_difference", "verdict", "error") if k in o}
             for s, o in outcomes.items()}  # fmt: skip
    print(json.dumps({"protocol": protocol, "settings": brief, "failed": results["failed"],
                      "wall_time_s": results["wall_time_s"], "machine": results["machine"],
                      "results": str(results_path)}))  # fmt: skip
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
