"""The game pilot of the normalisation-matrix study (``PROTOCOL.md``, "The game pilot, before any arm run").

Each candidate game (:data:`CANDIDATES`: a ``quickstart_game_<name>`` preset against OpenSpiel's uniform random
player) is trained four times: pilot seeds 0 and 1 (:data:`PILOT_SEEDS`, never arm seeds), each with the
``prompt``/``trajectory``/``std`` cell (``G-T``: estimator ``grpo``) and the ``prompt_agent``/``call``/``std`` cell
(``A-C``: estimator ``drmas``, the presets' own), so both ends of the 2 x 2 are piloted alike (:data:`CELLS`). A run
is a plain ``drmas train -c <preset> seed=S run.dir=... run.num_threads=1 run.progress=false`` (plus the cell's
estimator) in a child process, stopped at ``--limit-s`` (the protocol's 20 minutes on 2 cores: one torch thread a
run, two runs at a time, as the arms run). A candidate with a run over the limit is out ("too slow"), and its
remaining runs are not trained.

Outcome of a run (:func:`run_outcome`): the held-out return gain against ``random-v0``, i.e. per role (seat) the
mean return at the last validation minus at iteration 0, on the preset's same 256 seeded games (128 per seat), then
averaged over the roles with equal weight, as the protocol's game outcome. The choice (:func:`choose`) is the
protocol's rule: among the candidates whose four runs all finished within the limit, the largest mean gain over its
four runs, if that mean exceeds 2 SE (sample std of the four, ddof 1, / 2); otherwise the game setting is dropped.

Writes ``pilot.json`` (every run's record, the per-candidate table and the choice) and prints it; a finished run
keeps its record (``pilot_run.json`` in its run directory) and is reused, so the pilot continues across sessions.
So does a failed run's or an over-limit run's record: the protocol re-runs a failed run once, by deleting its run
directory and invoking the pilot again.

    python benchmarks/normalisation_matrix/pilot.py --jobs 2           # the protocol's 12 runs
    python benchmarks/normalisation_matrix/pilot.py --finished-only    # the table of the runs finished so far
    python benchmarks/normalisation_matrix/pilot.py --candidates kuhn_poker --iterations 1 --runs runs/pilot_smoke \\
        --out runs/pilot_smoke.json models.shared.name_or_path=tiny-llama   # a smoke run (not the protocol)

Exit codes: 0 done (whatever the choice), 1 a run failed (it is reported; the protocol re-runs it once), 2 bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: candidate -> preset (PROTOCOL.md: at least Kuhn poker, tic-tac-toe and connect four, against the random player)
CANDIDATES: dict[str, str] = {
    "kuhn_poker": "quickstart_game_kuhn_poker",
    "tic_tac_toe": "quickstart_game_tic_tac_toe",
    "connect_four": "quickstart_game_connect_four",
}
#: cell -> overrides on the preset (the presets are the A-C cell: estimator drmas)
CELLS: dict[str, tuple[str, ...]] = {"G-T": ("algorithm.estimator=grpo",), "A-C": ()}
PILOT_SEEDS = (0, 1)
LIMIT_S = 1200.0  # "pilot runs each take <= 20 minutes on 2 cores"
OPPONENT = "random-v0"
RECORD = "pilot_run.json"
QUALIFY_SE = 2.0  # "a candidate qualifies only if that mean exceeds 2 SE of the 4 runs pooled"


def run_outcome(validation: Mapping[str, Mapping[str, float]], opponent: str = OPPONENT) -> dict[str, Any]:
    """The protocol's game outcome of one run from its ``summary.json`` ``validation`` (iteration -> metrics).

    Returns:
        ``gain``: the mean over roles of (``val/<opponent>/<role>/return`` at the last validation minus at
        iteration 0), roles being the seats with a return at both; ``role_gain`` (role -> that difference);
        ``initial`` / ``final`` (role -> return); ``final_win`` (role -> win rate at the last validation);
        ``pooled_gain`` / ``pooled_gain_se`` (the trainer's ``val/<opponent>/return_gain`` ± SE, paired by game,
        None when absent); ``final_iteration``.

    Raises:
        ValueError: no validation at iteration 0 and after it, or no role's return in both
            (:func:`drmas_train.eval.game_metrics.role_return_gain`).
    """
    from drmas_train.eval.game_metrics import role_return_gain

    iters = sorted(int(i) for i in validation)
    if not iters or iters[0] != 0 or iters[-1] == 0:
        raise ValueError(f"the gain needs a validation at iteration 0 and a later one; validated: {iters}")
    first, last = validation[str(iters[0])], validation[str(iters[-1])]
    prefix = f"val/{opponent}/"
    gain = role_return_gain(first, last, prefix.rstrip("/"))
    roles = list(gain["roles"])
    initial = {r: first[f"{prefix}{r}/return"] for r in roles}
    final = {r: last[f"{prefix}{r}/return"] for r in roles}
    return {
        "gain": gain["gain"],
        "role_gain": gain["roles"],
        "initial": initial,
        "final": final,
        "final_win": {r: last.get(f"{prefix}{r}/win") for r in roles},
        "pooled_gain": last.get(f"{prefix}return_gain"),
        "pooled_gain_se": last.get(f"{prefix}return_gain_se"),
        "final_iteration": iters[-1],
    }


def choose(runs: Sequence[Mapping[str, Any]], limit_s: float = LIMIT_S,
           expected_runs: int = len(PILOT_SEEDS) * len(CELLS)) -> dict[str, Any]:  # fmt: skip
    """The protocol's choice rule over the pilot's run records (each ``candidate``, ``status``, ``wall_time_s`` and,
    when finished, ``outcome.gain``).

    Returns:
        ``table``: candidate -> ``n``, ``gains``, ``mean``, ``stderr`` (ddof 1 / sqrt(n); None for n < 2),
        ``max_wall_s``, ``eligible`` (all ``expected_runs`` finished within ``limit_s``), ``qualifies`` (eligible
        and mean > 2 SE) and ``why`` (for one that does not qualify: "too slow", "runs missing", "a run failed" or
        "did not learn"); ``chosen``: the qualifying candidate with the largest mean, or None (the game setting
        is dropped).
    """
    from drmas_train.eval.metrics import mean_stderr

    table: dict[str, dict[str, Any]] = {}
    for cand in dict.fromkeys(r["candidate"] for r in runs):
        rows = [r for r in runs if r["candidate"] == cand]
        gains = [r["outcome"]["gain"] for r in rows if r["status"] == "finished"]
        walls = [r["wall_time_s"] for r in rows if r.get("wall_time_s") is not None]
        est = mean_stderr(gains) if gains else None
        mean, se = (est.value, est.stderr) if est else (None, None)
        slow = any(r["status"] == "over_limit" or (r.get("wall_time_s") or 0) > limit_s for r in rows)
        failed = any(r["status"] == "failed" for r in rows)
        eligible = not slow and not failed and len(gains) == expected_runs
        qualifies = bool(eligible and mean is not None and se is not None and mean > QUALIFY_SE * se)
        why = None
        if not qualifies:
            why = ("too slow" if slow else "a run failed" if failed else "runs missing" if not eligible
                   else "did not learn")  # fmt: skip
        table[cand] = {"n": len(gains), "gains": gains, "mean": mean, "stderr": se,
                       "max_wall_s": max(walls) if walls else None, "eligible": eligible, "qualifies": qualifies,
                       "why": why}  # fmt: skip
    qualifying = [c for c, row in table.items() if row["qualifies"]]
    chosen = max(qualifying, key=lambda c: table[c]["mean"]) if qualifying else None
    return {"table": table, "chosen": chosen, "preset": CANDIDATES.get(chosen) if chosen else None}


def pilot_jobs(candidates: Sequence[str], runs: Path, seeds: Sequence[int] = PILOT_SEEDS,
               overrides: Sequence[str] = ()) -> list[dict[str, Any]]:  # fmt: skip
    """One job per candidate x seed x cell, in that order: ``candidate``, ``preset``, ``seed``, ``cell``,
    ``run_dir`` (``<runs>/<candidate>/<cell>_seed<S>``) and the run's ``overrides``."""
    jobs = []
    for cand in candidates:
        for seed in seeds:
            for cell, cell_overrides in CELLS.items():
                run_dir = runs / cand / f"{cell}_seed{seed}"
                jobs.append({"candidate": cand, "preset": CANDIDATES[cand], "seed": seed, "cell": cell,
                             "run_dir": str(run_dir),
                             "overrides": [f"seed={seed}", f"run.dir={run_dir}", "run.num_threads=1",
                                           "run.progress=false", *cell_overrides, *overrides]})  # fmt: skip
    return jobs


def train_job(job: dict[str, Any], limit_s: float) -> dict[str, Any]:
    """Train ``job`` in a child ``drmas train`` (one torch thread), stopped at ``limit_s`` seconds; write and return
    its record: the job, ``status`` ("finished", "over_limit" or "failed"), ``wall_time_s``, ``load_start`` /
    ``load_end`` (1-minute load average), ``returncode`` and, when finished, ``outcome`` (:func:`run_outcome`). A
    run directory with a record is reused as it is; one without (an interrupted attempt) is trained again
    (``--overwrite``)."""
    run_dir = Path(job["run_dir"])
    if (run_dir / RECORD).is_file():
        return json.loads((run_dir / RECORD).read_text())
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "drmas_train.cli", "train", "-c", job["preset"], *job["overrides"]]
    if run_dir.exists():
        cmd.append("--overwrite")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    load_start, t0 = os.getloadavg()[0], time.perf_counter()
    with open(str(run_dir) + ".log", "w", encoding="utf-8") as log:
        try:
            rc: int | None = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=limit_s).returncode
        except subprocess.TimeoutExpired:
            rc = None
    wall = time.perf_counter() - t0
    record: dict[str, Any] = {**job, "wall_time_s": round(wall, 1), "load_start": load_start,
                              "load_end": os.getloadavg()[0], "returncode": rc, "limit_s": limit_s}  # fmt: skip
    if rc is None:
        record["status"] = "over_limit"
    elif rc != 0 or not (run_dir / "summary.json").is_file():
        record["status"] = "failed"
    else:
        summary = json.loads((run_dir / "summary.json").read_text())
        record.update(status="finished", outcome=run_outcome(summary["validation"]))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RECORD).write_text(json.dumps(record, indent=1))
    return record


def _skipped(job: dict[str, Any]) -> dict[str, Any]:
    return {**job, "status": "not_run", "why": "another run of this candidate went over the limit"}


def run_pilot(jobs: Sequence[dict[str, Any]], n_jobs: int, limit_s: float, train: bool) -> list[dict[str, Any]]:
    """The records of ``jobs``: candidate by candidate, ``n_jobs`` runs at a time; after a run over the limit, the
    candidate's remaining runs are not trained. With ``train`` False, only the finished runs' records (the rest
    ``"pending"``)."""
    records: list[dict[str, Any]] = []
    for cand in dict.fromkeys(j["candidate"] for j in jobs):
        todo = [j for j in jobs if j["candidate"] == cand]
        over = False
        for start in range(0, len(todo), n_jobs):
            chunk = todo[start:start + n_jobs]
            if over:
                records += [_skipped(j) for j in chunk]
                continue
            if not train:
                records += [json.loads((Path(j["run_dir"]) / RECORD).read_text())
                            if (Path(j["run_dir"]) / RECORD).is_file() else {**j, "status": "pending"}
                            for j in chunk]  # fmt: skip
            else:
                with ThreadPoolExecutor(max_workers=n_jobs) as pool:
                    records += list(pool.map(lambda j: train_job(j, limit_s), chunk))
            over = any(r["status"] == "over_limit" for r in records if r["candidate"] == cand)
    return records


def table_markdown(result: Mapping[str, Any]) -> str:
    """The pilot's table for ``pilot.md``: one row per candidate (preset, the four gains, mean ± SE, the longest
    run, the verdict)."""
    lines = ["| candidate | preset | gains (G-T s0, A-C s0, G-T s1, A-C s1) | mean ± SE | longest run | verdict |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for cand, row in result["table"].items():
        gains = ", ".join(f"{g:+.3f}" for g in row["gains"]) or "-"
        est = f"{row['mean']:+.3f} ± {row['stderr']:.3f}" if row["stderr"] is not None else "-"
        wall = f"{row['max_wall_s']:.0f} s" if row["max_wall_s"] is not None else "-"
        verdict = "chosen" if cand == result["chosen"] else ("qualifies" if row["qualifies"] else row["why"])
        lines.append(f"| {cand} | `{CANDIDATES[cand]}` | {gains} | {est} | {wall} | {verdict} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES), metavar="GAME",
                   help=f"candidates to pilot (default all: {', '.join(CANDIDATES)})")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2; each one torch thread)")
    p.add_argument("--limit-s", type=float, default=LIMIT_S, help="a run's wall-clock limit (protocol: 1200)")
    p.add_argument("--runs", type=Path, default=Path("runs/normalisation_matrix_pilot"), help="where the runs go")
    p.add_argument("--out", type=Path, default=HERE / "pilot.json", help="the pilot's JSON (default: this folder)")
    p.add_argument("--iterations", type=int, default=None, help="override run.iterations (smoke runs only)")
    p.add_argument("--finished-only", action="store_true", help="train nothing: the table of the finished runs")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every run (not the protocol)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, train the missing runs, write and print the pilot's JSON; see the module docstring."""
    args = _parser().parse_args(argv)
    if args.jobs < 1 or args.limit_s <= 0:
        print(f"pilot.py: --jobs must be >= 1 and --limit-s > 0, got {args.jobs} and {args.limit_s}", file=sys.stderr)
        return 2
    if bad := [o for o in args.overrides if "=" not in o]:
        print(f"pilot.py: overrides must look like key=value, got {bad}", file=sys.stderr)
        return 2
    overrides = [*args.overrides, *([f"run.iterations={args.iterations}"] if args.iterations else [])]
    jobs = pilot_jobs(args.candidates, args.runs, overrides=overrides)
    records = run_pilot(jobs, args.jobs, args.limit_s, train=not args.finished_only)
    result = {"protocol": not overrides and args.limit_s == LIMIT_S, "limit_s": args.limit_s,
              "runs": records, **choose(records, args.limit_s)}  # fmt: skip
    result["table_markdown"] = table_markdown(result)
    text = json.dumps(result, indent=1)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 1 if any(r["status"] == "failed" for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
