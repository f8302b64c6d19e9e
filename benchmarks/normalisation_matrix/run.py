"""Which of Dr. MAS's two changes matters: the runs and outcomes of ``benchmarks/normalisation_matrix/PROTOCOL.md``.

Eight arms per setting, one cell each of ``algorithm.grouping`` x ``algorithm.units`` x ``algorithm.scale``
(:data:`SETTINGS`), trained for the protocol's seeds (2000, 2001, 2002) by the run loop of
``benchmarks/learning/estimators.py`` (one real ``drmas train`` per preset x seed at one torch thread, reused when
already finished, so the study continues across sessions). Then the protocol's outcomes per setting:

* the two families of paired contrasts (:data:`PRIMARY`, :data:`SCALE`): per contrast ``d_s = outcome(X, s) -
  outcome(Y, s)``, mean ± SE (sample std, ddof 1, / sqrt(n)), the paired t statistic with n - 1 degrees of freedom,
  its two-sided p, the Holm-Bonferroni adjusted p within the family, across the settings (:func:`holm`,
  :func:`holm_across`) and the verdict (:func:`contrast_verdict`);
* the descriptive contrasts (:data:`DESCRIPTIVE`: the interaction, Eq. 5 as a whole), without a verdict;
* the study's verdict per setting (:func:`setting_verdict`) and whether the pre-registered extension to seeds 2003
  and 2004 is due (:func:`extension_due`);
* per arm and role, pooled over seeds: the Prop. 4.3 factor ``adv/<role>/prop43_ratio`` (mean and max over
  iterations) next to the measured ``adv/<role>/second_moment``, and gradient-norm spikes per model and per role
  (:func:`role_spikes`);
* per primary contrast, the per-task paired difference of the final held-out scores pooled over seeds;
* wall time, peak RSS and load per run.

Writes ``results.json`` (every run's record plus ``normalisation_matrix``: the outcomes above) and
``normalisation_matrix.png`` (:func:`plot_outcomes`), and prints one JSON object. Exit codes as ``estimators.py``:
0 ok, 1 a run failed, 2 bad arguments.

    python benchmarks/normalisation_matrix/run.py --jobs 2          # the protocol's runs: 2 settings x 8 arms x 3 seeds
    python benchmarks/normalisation_matrix/run.py --finished-only   # outcomes of the runs finished so far
    python benchmarks/normalisation_matrix/run.py --settings game --jobs 2   # the game's 24 runs (7-11 min each in the pilot)
    python benchmarks/normalisation_matrix/run.py --arms A-C G-T --iterations 1 --out runs/nm_smoke \\
        models.shared.name_or_path=tiny-llama                        # a smoke run (not the protocol)

A study measured over several sessions: each invocation trains what is missing and reuses the rest; ``--finished-only``
trains nothing and computes the outcomes over the seeds where both arms of a contrast finished (the rest is listed
under ``pending``). Anything but the protocol's seeds, iterations and no overrides prints ``"protocol": false``.
The game setting joined :data:`SETTINGS` by amendment 1 (PROTOCOL.md): the pilot (``pilot.py``, ``pilot.md``)
chose Kuhn poker, ``quickstart_game_kuhn_poker``; a game run's outcome is its return gain against the random
player averaged over the seats (``estimators.py``'s record of a game run).
"""

from __future__ import annotations

import argparse
import functools
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
ESTIMATORS = HERE.parent / "learning" / "estimators.py"
PAPER_EFFECT = HERE.parent / "paper_effect" / "run.py"

#: setting -> arm -> preset; PROTOCOL.md "Arms" (grouping - units [- scale]; G = prompt, A = prompt_agent,
#: T = trajectory, C = call; std unless named)
SETTINGS: dict[str, dict[str, str]] = {
    "math": {
        "G-T": "quickstart_math_grpo",
        "G-C": "quickstart_math_grpo_step",
        "A-C": "quickstart_math",
        "A-T": "quickstart_math_cell_agent_traj",
        "A-C-mean": "quickstart_math_cell_agent_call_mean",
        "A-C-bstd": "quickstart_math_cell_agent_call_batchstd",
        "A-T-mean": "quickstart_math_cell_agent_traj_mean",
        "A-T-bstd": "quickstart_math_cell_agent_traj_batchstd",
    },
    # amendment 1 (PROTOCOL.md): the game pilot (pilot.md) chose Kuhn poker against the uniform random player
    "game": {
        "G-T": "quickstart_game_kuhn_poker_grpo",
        "G-C": "quickstart_game_kuhn_poker_grpo_step",
        "A-C": "quickstart_game_kuhn_poker",
        "A-T": "quickstart_game_kuhn_poker_cell_agent_traj",
        "A-C-mean": "quickstart_game_kuhn_poker_cell_agent_call_mean",
        "A-C-bstd": "quickstart_game_kuhn_poker_cell_agent_call_batchstd",
        "A-T-mean": "quickstart_game_kuhn_poker_cell_agent_traj_mean",
        "A-T-bstd": "quickstart_game_kuhn_poker_cell_agent_traj_batchstd",
    },
}
#: PROTOCOL.md "Contrasts": name -> (arm X, arm Y), d = outcome(X) - outcome(Y)
PRIMARY: dict[str, tuple[str, str]] = {
    "grouping | trajectory": ("A-T", "G-T"),
    "grouping | call": ("A-C", "G-C"),
    "units | per-agent": ("A-C", "A-T"),
    "units | global": ("G-C", "G-T"),
}
SCALE: dict[str, tuple[str, str]] = {
    "A-C-mean - A-C": ("A-C-mean", "A-C"),
    "A-C-bstd - A-C": ("A-C-bstd", "A-C"),
    "A-T-mean - A-T": ("A-T-mean", "A-T"),
    "A-T-bstd - A-T": ("A-T-bstd", "A-T"),
}
#: descriptive, no verdict: name -> ((+arms), (-arms)), d = sum(+) - sum(-)
DESCRIPTIVE: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "interaction (A-C - A-T) - (G-C - G-T)": (("A-C", "G-T"), ("A-T", "G-C")),
    "Eq. 5 as a whole, A-C - G-T": (("A-C",), ("G-T",)),
}
FIRST_SEED, SEEDS = 2000, 3  # PROTOCOL.md "Seeds and runs"
EXTENSION_SEEDS = (2003, 2004)
ALPHA = 0.05  # family-wise, Holm within each family
NOMINAL_SE = 2.0  # "nominal only": |mean(d)| > 2 SE without surviving Holm
SPIKE_FACTOR = 3.0  # PROTOCOL.md "Secondary outcomes" 2


def _load(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _paper_effect() -> Any:
    """``benchmarks/paper_effect/run.py``, loaded once (its ``mean_stderr``, ``spike_count`` and ``series``: the same
    definitions here)."""
    return _load(PAPER_EFFECT, "drmas_bench_paper_effect")


def paired_t(d: Sequence[float]) -> dict[str, Any]:
    """The paired t-test of the differences ``d`` (one per seed): ``mean``, ``stderr`` (sample std, ddof 1, /
    sqrt(n)), ``n``, ``t`` = mean / stderr and ``p``, two-sided with n - 1 degrees of freedom (Student's t,
    ``scipy.stats.t``). ``t`` and ``p`` are None for n < 2; for a zero stderr, t is +-inf (p 0) or, with a zero
    mean, 0 (p 1).

    Raises:
        ValueError: no differences.
    """
    from scipy import stats

    est = _paper_effect().mean_stderr(list(d))
    se, n = est["stderr"], est["n"]
    if se is None:
        return {**est, "t": None, "p": None}
    if se == 0:
        t = 0.0 if est["mean"] == 0 else math.copysign(math.inf, est["mean"])
    else:
        t = est["mean"] / se
    p = 1.0 if t == 0 else 2.0 * float(stats.t.sf(abs(t), n - 1))
    return {**est, "t": t, "p": p}


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values (Holm 1979), in the input's order: the i-th smallest of the m given p's
    becomes ``max over j <= i of min(1, (m - j + 1) p_(j))``. A None (a contrast without a test yet) stays None and
    does not count in m. A contrast survives at family-wise ``alpha`` when its adjusted p <= alpha."""
    given = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(given)
    out: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(given):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def contrast_verdict(test: Mapping[str, Any], p_holm: float | None, alpha: float = ALPHA) -> str:
    """PROTOCOL.md's verdict on one contrast: ``moves the result (+)`` / ``(-)`` when its Holm-adjusted p <= alpha;
    ``nominal only`` when |mean| > 2 SE without surviving Holm; else ``not distinguishable at n = <n>``."""
    n, mean, se = test["n"], test["mean"], test["stderr"]
    if p_holm is not None and p_holm <= alpha:
        return f"moves the result ({'+' if mean > 0 else '-'})"
    if se is not None and abs(mean) > NOMINAL_SE * se:
        return "nominal only"
    return f"not distinguishable at n = {n}"


def family(outcome: Mapping[int, Mapping[str, float]], contrasts: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """One family of paired contrasts over ``outcome`` (seed -> arm -> the run's outcome): per contrast the seeds
    where both arms finished, :func:`paired_t` of their differences, the Holm-adjusted p within the family, the
    verdict and the difference a 2-SE rule could detect (``detectable``: 2 SE)."""
    rows: dict[str, Any] = {}
    for name, (x, y) in contrasts.items():
        seeds = sorted(s for s, arms in outcome.items() if x in arms and y in arms)
        d = [outcome[s][x] - outcome[s][y] for s in seeds]
        test = paired_t(d) if d else {"mean": None, "stderr": None, "n": 0, "t": None, "p": None}
        rows[name] = {"arms": [x, y], "seeds": seeds, **test,
                      "detectable": NOMINAL_SE * test["stderr"] if test["stderr"] is not None else None}  # fmt: skip
    adjusted = holm([r["p"] for r in rows.values()])
    for r, p_holm in zip(rows.values(), adjusted, strict=True):
        r["p_holm"] = p_holm
        r["verdict"] = contrast_verdict(r, p_holm) if r["n"] else "no seed has both arms yet"
    return rows


def descriptive(outcome: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    """:data:`DESCRIPTIVE`'s contrasts: mean ± SE over the seeds where every arm involved finished; no verdict."""
    out = {}
    for name, (plus, minus) in DESCRIPTIVE.items():
        seeds = sorted(s for s, arms in outcome.items() if all(a in arms for a in (*plus, *minus)))
        d = [sum(outcome[s][a] for a in plus) - sum(outcome[s][a] for a in minus) for s in seeds]
        out[name] = {"seeds": seeds, **(_paper_effect().mean_stderr(d) if d else {"mean": None, "stderr": None, "n": 0})}
    return out


def holm_across(outcomes: Mapping[str, dict[str, Any]]) -> None:
    """PROTOCOL.md "Tests and correction": Holm within each family *across the settings* (the primary family is 4
    contrasts per setting, 8 with both settings; likewise the scale family). Rewrites, in place, each contrast's
    ``p_holm`` and ``verdict`` (as :func:`family` gives them within one setting) and each setting's ``verdict`` and
    ``extension_due`` from the joint adjustment; with one setting it changes nothing."""
    for fam in ("primary", "scale"):
        rows = [row for o in outcomes.values() for row in o[fam].values()]
        for row, p_holm in zip(rows, holm([r["p"] for r in rows]), strict=True):
            row["p_holm"] = p_holm
            row["verdict"] = contrast_verdict(row, p_holm) if row["n"] else "no seed has both arms yet"
    for o in outcomes.values():
        o["verdict"] = setting_verdict(o["primary"], o["scale"])
        o["extension_due"] = extension_due(o["primary"])


def setting_verdict(primary: Mapping[str, Any], scale: Mapping[str, Any]) -> dict[str, Any]:
    """PROTOCOL.md "The study's verdict" for one setting: whether grouping, units and the scale move the result
    (each if any of its contrasts does), the nominal-only contrasts, and the plain sentence when nothing moves."""

    def moves(rows: Mapping[str, Any], prefix: str = "") -> bool:
        return any(r["verdict"].startswith("moves") for name, r in rows.items() if name.startswith(prefix))

    out = {"grouping moves the result": moves(primary, "grouping"),
           "units move the result": moves(primary, "units"),
           "the scale moves the result": moves(scale),
           "nominal only": [n for rows in (primary, scale) for n, r in rows.items() if r["verdict"] == "nominal only"]}  # fmt: skip
    ns = sorted({r["n"] for rows in (primary, scale) for r in rows.values() if r["n"]})
    if max(ns, default=0) < SEEDS:  # the protocol's verdict is about n = 3 seeds (or 5 after the extension)
        out["sentence"] = (f"no verdict yet: the contrasts have n = {'/'.join(map(str, ns)) or 0} seed(s) so far; the "
                           f"protocol's verdict uses n = {SEEDS}")  # fmt: skip
    elif not any(out[k] for k in ("grouping moves the result", "units move the result", "the scale moves the result")):
        detectable = [r["detectable"] for r in primary.values() if r["detectable"] is not None]
        out["sentence"] = (f"no contrast moves the held-out outcome at n = {'/'.join(map(str, ns))} seeds"
                           + (f"; detectable (2 SE): up to ±{max(detectable):.3f}" if detectable else ""))  # fmt: skip
    return out


def extension_due(primary: Mapping[str, Any]) -> bool:
    """PROTOCOL.md's one pre-registered extension: a primary contrast with |mean(d)| > 2 SE at n = 3 that does not
    survive Holm adds seeds 2003 and 2004 to every arm of the setting (once)."""
    return any(r["n"] == SEEDS and r["verdict"] == "nominal only" for r in primary.values())


def role_spikes(rows: Sequence[Mapping[str, Any]], role: str, factor: float = SPIKE_FACTOR) -> int:
    """Iterations whose ``agent/<role>/grad_norm_max`` exceeds ``factor`` x the median over the run's iterations of
    ``agent/<role>/grad_norm`` (PROTOCOL.md "Secondary outcomes" 2, per role): paper_effect's ``spike_count`` in the
    ``agent`` namespace."""
    return _paper_effect().spike_count(rows, role, factor, namespace="agent")


def run_secondary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's secondary figures from its ``metrics.jsonl`` rows (iterations >= 1): per role the Prop. 4.3
    factor (``adv/<role>/prop43_ratio``: every iteration's value), the measured ``adv/<role>/second_moment``
    values and the role's spike count; per model the spike count and the pre-clip gradient norms (mean, median,
    max of ``loss/<model>/grad_norm``)."""
    pe = _paper_effect()
    it = [r for r in rows if r.get("iteration", 0) > 0]
    roles = sorted({k.split("/")[1] for r in it for k in r if k.startswith("adv/") and k.endswith("/prop43_ratio")})
    models = sorted({k.split("/")[1] for r in it for k in r if k.startswith("loss/") and k.endswith("/grad_norm")})
    out: dict[str, Any] = {"roles": {}, "models": {}}
    for role in roles:
        out["roles"][role] = {"prop43": pe.series(rows, f"adv/{role}/prop43_ratio"),
                              "second_moment": pe.series(rows, f"adv/{role}/second_moment"),
                              "spikes": role_spikes(it, role)}  # fmt: skip
    for m in models:
        g = pe.series(rows, f"loss/{m}/grad_norm")
        out["models"][m] = {"spikes": pe.spike_count(it, m), "grad_norm": {"mean": statistics.fmean(g), "median": statistics.median(g),
                                                                            "max": max(g)} if g else None}  # fmt: skip
    return out


def arm_secondary(secondaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per role, pooled over an arm's runs: the Prop. 4.3 factor's mean and max over iterations, the mean measured
    advantage second moment, and the spikes summed over seeds; per model the spikes summed and the max gradient norm."""
    roles = sorted({role for s in secondaries for role in s["roles"]})
    models = sorted({m for s in secondaries for m in s["models"]})
    out: dict[str, Any] = {"roles": {}, "models": {}}
    for role in roles:
        f = [v for s in secondaries for v in s["roles"].get(role, {}).get("prop43", [])]
        m2 = [v for s in secondaries for v in s["roles"].get(role, {}).get("second_moment", [])]
        out["roles"][role] = {"prop43_mean": statistics.fmean(f) if f else None, "prop43_max": max(f) if f else None,
                              "second_moment_mean": statistics.fmean(m2) if m2 else None,
                              "spikes": sum(s["roles"].get(role, {}).get("spikes", 0) for s in secondaries)}  # fmt: skip
    for m in models:
        norms = [s["models"][m]["grad_norm"] for s in secondaries if m in s["models"] and s["models"][m]["grad_norm"]]
        out["models"][m] = {"spikes": sum(s["models"].get(m, {}).get("spikes", 0) for s in secondaries),
                            "grad_norm_max": max(n["max"] for n in norms) if norms else None}  # fmt: skip
    return out


def setting_outcomes(arms: Mapping[str, str], runs: Sequence[Mapping[str, Any]],
                     secondary: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:  # fmt: skip
    """The protocol's outcomes of one setting from its runs' records (``estimators.py``'s ``benchmark_run.json``:
    ``preset``, ``seed``, ``gain``, ``final_scores``, ``wall_time_s``, ``peak_rss_gb``, ``load_start`` /
    ``load_end``, ``run_dir``) and :func:`run_secondary` by ``run_dir``; ``arms`` maps arm -> preset."""
    preset_arm = {p: a for a, p in arms.items()}
    mine = [r for r in runs if r["preset"] in preset_arm]
    outcome: dict[int, dict[str, float]] = {}
    for r in mine:
        outcome.setdefault(r["seed"], {})[preset_arm[r["preset"]]] = r["gain"]
    primary, scale = family(outcome, PRIMARY), family(outcome, SCALE)
    by_arm: dict[str, list[Mapping[str, Any]]] = {a: [] for a in arms}
    for r in mine:
        by_arm[preset_arm[r["preset"]]].append(r)
    pe = _paper_effect()
    per_task = {}
    for name, (x, y) in PRIMARY.items():
        xs = {r["seed"]: r for r in by_arm[x]}
        d = [xs[r["seed"]]["final_scores"][t] - r["final_scores"][t] for r in by_arm[y] if r["seed"] in xs
             for t in sorted(r["final_scores"]) if t in xs[r["seed"]]["final_scores"]]  # fmt: skip
        # per-task differences need several held-out tasks; a game validates one (its rules) on many seeded games
        per_task[name] = pe.mean_stderr(d) if len(d) > len({r["seed"] for r in by_arm[y]}) else None
    return {
        "arms": {a: {"preset": arms[a],
                     "gain": pe.mean_stderr([r["gain"] for r in by_arm[a]]) if by_arm[a] else None,
                     "runs": [{"seed": r["seed"], "gain": r["gain"], "gain_stderr": r["gain_stderr"],
                               "wall_time_s": r["wall_time_s"], "peak_rss_gb": r["peak_rss_gb"],
                               "load": [r["load_start"], r["load_end"]]} for r in sorted(by_arm[a], key=lambda r: r["seed"])],
                     "secondary": arm_secondary([secondary[r["run_dir"]] for r in by_arm[a]])}
                 for a in arms},  # fmt: skip
        "primary": primary,
        "scale": scale,
        "descriptive": descriptive(outcome),
        "per_task": per_task,
        "verdict": setting_verdict(primary, scale),
        "extension_due": extension_due(primary),
        "pending": sorted(f"{a} seed {s}" for a in arms for s in range(FIRST_SEED, FIRST_SEED + SEEDS)
                          if s not in {r["seed"] for r in by_arm[a]}),  # fmt: skip
    }


def plot_outcomes(outcomes: Mapping[str, Mapping[str, Any]], path: Path) -> Any:
    """``normalisation_matrix.png``: per setting, each arm's seeds (dots) and mean ± SE of the held-out gain (top),
    and each role's Prop. 4.3 factor (mean over iterations, pooled over seeds) and spike count per arm (bottom).
    Returns the matplotlib figure (closed, saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(outcomes), 1)
    fig, axes = plt.subplots(2, n, figsize=(7.5 * n, 7.5), squeeze=False)
    for col, (setting, o) in enumerate(outcomes.items()):
        top, bottom = axes[0][col], axes[1][col]
        names = list(o["arms"])
        for x, a in enumerate(names):
            arm = o["arms"][a]
            top.plot([x] * len(arm["runs"]), [r["gain"] for r in arm["runs"]], "o", color="0.6", ms=4)
            if arm["gain"] is not None:
                top.errorbar([x + 0.15], [arm["gain"]["mean"]], yerr=[arm["gain"]["stderr"] or 0.0], fmt="s",
                             color="C3", capsize=4)  # fmt: skip
        top.set(xticks=range(len(names)), xticklabels=names, ylabel="held-out gain (avg@k; a game: return)",
                title=f"{setting}: gain per arm")  # fmt: skip
        top.axhline(0.0, color="0.85", lw=0.8)
        roles = sorted({r for a in names for r in o["arms"][a]["secondary"]["roles"]})
        width = 0.8 / max(len(roles), 1)
        for j, role in enumerate(roles):
            vals = [o["arms"][a]["secondary"]["roles"].get(role, {}).get("prop43_mean") or 0.0 for a in names]
            spikes = [o["arms"][a]["secondary"]["roles"].get(role, {}).get("spikes", 0) for a in names]
            xs = [x + (j - (len(roles) - 1) / 2) * width for x in range(len(names))]
            bottom.bar(xs, vals, width=width, label=role)
            for x, v, s in zip(xs, vals, spikes, strict=True):
                if s:
                    bottom.annotate(f"{s} spikes", (x, v), ha="center", va="bottom", fontsize=7)
        bottom.axhline(1.0, color="0.6", lw=0.8, ls="--")
        bottom.set(xticks=range(len(names)), xticklabels=names, ylabel="Prop. 4.3 factor (mean over iterations)",
                   title="each role's Prop. 4.3 factor, pooled over seeds")  # fmt: skip
        if roles:
            bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS), metavar="SETTING",
                   help=f"settings to run (default all: {', '.join(SETTINGS)})")  # fmt: skip
    p.add_argument("--arms", nargs="+", default=None, metavar="ARM",
                   help="train only these arms (e.g. A-C G-T); the outcomes use every finished run")
    p.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds per arm (protocol: {SEEDS})")
    p.add_argument("--first-seed", type=int, default=FIRST_SEED, help=f"first seed (protocol: {FIRST_SEED})")
    p.add_argument("--iterations", type=int, default=None, help="override run.iterations (smoke runs only)")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1; each one torch thread)")
    p.add_argument("--runs", default="runs/normalisation_matrix", help="where the training runs go")
    p.add_argument("--out", default=str(HERE), help="results.json and the plot (default: this folder)")
    p.add_argument("--finished-only", action="store_true", help="train nothing: outcomes of the finished runs")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run (not the protocol)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the study; returns the exit code (0 ok, 1 a run failed, 2 bad arguments)."""
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    arms = {s: SETTINGS[s] for s in args.settings}
    known = {a for s in arms.values() for a in s}
    if args.arms and (unknown := sorted(set(args.arms) - known)):
        print(f"error: unknown arm(s) {unknown}; the arms are {sorted(known)}", file=sys.stderr)
        return 2
    presets = [p for s in arms.values() for a, p in s.items() if not args.arms or a in args.arms]
    protocol = (args.seeds, args.first_seed, args.iterations, args.overrides) == (SEEDS, FIRST_SEED, None, [])
    inner = ["--presets", *presets, "--seeds", str(args.seeds), "--first-seed", str(args.first_seed),
             "--jobs", str(args.jobs), "--threads", "1", "--runs", args.runs, "--out", args.out,
             "--title", "Which of Dr. MAS's two changes matters (benchmarks/normalisation_matrix/PROTOCOL.md)",
             *(["--iterations", str(args.iterations)] if args.iterations is not None else []),
             *(["--finished-only"] if args.finished_only else []), *args.overrides]  # fmt: skip
    # its own process (its run loop spawns workers that import it by path); its JSON goes to stderr, so that stdout
    # carries this script's one JSON object
    proc = subprocess.run([sys.executable, str(ESTIMATORS), *inner], stdout=subprocess.PIPE, text=True, check=False)
    sys.stderr.write(proc.stdout)
    if proc.returncode == 2:
        return 2
    from drmas_train.run.metrics_log import read_metrics

    results_path = Path(args.out) / "results.json"
    results = json.loads(results_path.read_text())
    runs = results["runs"]
    secondary = {r["run_dir"]: run_secondary(read_metrics(Path(r["run_dir"]) / "metrics.jsonl")) for r in runs}
    outcomes = {s: setting_outcomes(a, runs, secondary) for s, a in arms.items()}
    holm_across(outcomes)
    results["normalisation_matrix"] = {"protocol": protocol, "settings": outcomes}
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    plot_outcomes(outcomes, Path(args.out) / "normalisation_matrix.png")
    brief = {s: {"verdict": o["verdict"], "extension_due": o["extension_due"], "pending": len(o["pending"]),
                 "primary": {n: {k: r[k] for k in ("mean", "stderr", "n", "p_holm", "verdict")}
                             for n, r in o["primary"].items()}}
             for s, o in outcomes.items()}  # fmt: skip
    print(json.dumps({"protocol": protocol, "settings": brief, "failed": results.get("failed"),
                      "results": str(results_path)}))  # fmt: skip
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
