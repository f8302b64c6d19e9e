"""Sync vs asynchronous training with overlap, measured: the math quickstart at equal samples and at equal wall-clock.

Runs ``benchmarks/learning/quickstart.py`` once per arm, one after the other, each in its own process (its peak RSS
is its own), with validation every 2 iterations so that the held-out gain can be read against the run's wall-clock
(``perf/elapsed_s`` of each validated iteration)::

    HF_HUB_OFFLINE=1 python benchmarks/perf/async_overlap.py --out benchmarks/perf/data/async_overlap.json
    HF_HUB_OFFLINE=1 python benchmarks/perf/async_overlap.py --arms sync_2t async_overlap   # a subset

Arms (all ``quickstart_math``, seed 0, 8 iterations of 4 tasks x 4 episodes, ``eval.every=2``):

* ``sync_2t``: the synchronous loop, 2 torch threads (what ``drmas train`` does on 2 cores);
* ``sync_1t``: the synchronous loop, 1 thread (generation and update taking turns on one core); validated at 0, 4
  and 8 only, as it serves the speed ratio (``train_s_per_iteration``), not the wall-clock curve;
* ``async_overlap``: ``run.mode=async``, ``run.overlap=true``, η = 1, the decoupled objective with cap 5, 1 torch
  thread for the generation thread and 1 for the trainer (docs/async.md, "Overlap");
* ``ray_sync``: the synchronous loop through Ray (``distributed.enabled=true``, one training rank and one HF
  generation engine for the shared model, 1 CPU and 1 torch thread each, the driver on 1 thread): the engine and
  the rank take turns;
* ``ray_async_overlap``: ``ray_sync`` with ``async_overlap``'s settings: the driver's generation thread keeps the
  engine busy while the rank trains (docs/async.md, "On Ray").

Each asynchronous arm is compared with the synchronous arms of its own path (:data:`PAIRS`).

Output (JSON): per arm the quickstart figures (``validation`` with ``elapsed_s`` added, ``wall_time_s``,
``peak_rss_gb``, ``load_average`` before, ``load_after``), its mean ``perf/`` seconds per iteration (``rollout_s`` is
the time a step waited for its samples), ``train_s_per_iteration`` (the mean of ``iteration_s - eval_s``: what
``benchmarks/perf/async_sim.py --cpu-check`` predicts), its staleness; then ``equal_samples`` (each arm's gain after 8
iterations) and ``equal_wall_clock``: for each sync arm, its gain at the last validation it had finished by the
time the async arm finished (``elapsed_s``), next to the async arm's final gain (``ray_equal_wall_clock`` for the Ray
pair); ``speedup_<sync arm>``: the sync arm's over its async arm's elapsed seconds at their last validation, and
their ``train_s_per_iteration`` ratio.

Measure on an otherwise idle machine and quote the load: the arms run one after another, and another process on
the 2 cores slows them unequally.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parent / "learning" / "quickstart.py"

COMMON = ("eval.every=2", "run.save_every=0", "run.plot=false", "run.tensorboard=false")
ASYNC = ("run.mode=async", "run.overlap=true", "run.max_staleness=1", "algorithm.behaviour_weight_cap=5")
RAY = ("distributed.enabled=true", "distributed.world_size.shared=1", "distributed.cpus_per_worker=1")
ARMS: dict[str, tuple[str, ...]] = {
    "sync_2t": ("run.num_threads=2",),
    "sync_1t": ("run.num_threads=1", "eval.every=4"),  # for the speed ratio only: fewer validations
    "async_overlap": (*ASYNC, "run.num_threads=1"),
    "ray_sync": (*RAY, "run.num_threads=1"),
    "ray_async_overlap": (*RAY, *ASYNC, "run.num_threads=1"),
}  # fmt: skip
#: each asynchronous arm, the synchronous arms it is compared with (the same path), and its equal-wall-clock key
PAIRS: dict[str, tuple[tuple[str, ...], str]] = {
    "async_overlap": (("sync_2t", "sync_1t"), "equal_wall_clock"),
    "ray_async_overlap": (("ray_sync",), "ray_equal_wall_clock"),
}


def arm_record(quickstart: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures: the quickstart JSON with each validation's ``elapsed_s`` (the ``perf/elapsed_s`` of its
    iteration; 0 for the validation before training), mean seconds per iteration of each ``perf/`` timing, and the
    mean/max staleness over the iterations.

    Raises:
        KeyError: a validated iteration without ``perf/elapsed_s`` (a run from before drmas logged it).
    """
    by_iter = {r["iteration"]: r for r in rows}
    validation = [{**v, "elapsed_s": 0.0 if v["iteration"] == 0 else by_iter[v["iteration"]]["perf/elapsed_s"]}
                  for v in quickstart["validation"]]  # fmt: skip
    steps = [r for r in rows if r["iteration"] > 0 and "perf/iteration_s" in r]
    perf = {k.removeprefix("perf/"): statistics.fmean(r[k] for r in steps)
            for k in ("perf/rollout_s", "perf/generate_s", "perf/update_s", "perf/eval_s", "perf/iteration_s")}  # fmt: skip
    stale = [v for r in steps for k, v in r.items() if k.startswith("staleness/") and k.endswith("/mean")]
    train_s = statistics.fmean(r["perf/iteration_s"] - r["perf/eval_s"] for r in steps)
    return {**quickstart, "validation": validation, "perf_mean_s": perf, "train_s_per_iteration": train_s,
            "staleness_mean": statistics.fmean(stale) if stale else None}  # fmt: skip


def gain_at(record: dict[str, Any], seconds: float) -> dict[str, Any] | None:
    """The last validation (with a gain) of ``record`` whose ``elapsed_s`` is at most ``seconds``, or None."""
    done = [v for v in record["validation"] if "gain" in v and v["elapsed_s"] <= seconds]
    return done[-1] if done else None


def compare(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``equal_samples`` and ``equal_wall_clock`` of the arms (module docstring)."""
    out: dict[str, Any] = {"equal_samples": {name: {k: r["validation"][-1].get(k) for k in ("iteration", "gain", "gain_stderr")}
                                             | {"wall_time_s": r["wall_time_s"]} for name, r in records.items()}}  # fmt: skip
    for async_arm, (sync_arms, key) in PAIRS.items():
        if async_arm not in records:
            continue
        a = records[async_arm]
        t = a["validation"][-1]["elapsed_s"]
        out[key] = {"seconds": t, async_arm: a["validation"][-1]}
        for name in sync_arms:
            if name in records:
                r = records[name]
                out[key][name] = gain_at(r, t)
                out[f"speedup_{name}"] = {"elapsed": r["validation"][-1]["elapsed_s"] / t,
                                          "train_s_per_iteration": r["train_s_per_iteration"] / a["train_s_per_iteration"]}  # fmt: skip
    return out


def run_arm(name: str, folder: Path, extra: list[str]) -> dict[str, Any]:
    """Run one arm through ``quickstart.py`` in a child process; its figures (:func:`arm_record`)."""
    from drmas_train.run.metrics_log import read_metrics

    cmd = [sys.executable, str(QUICKSTART), "--run-dir", str(folder / name), *COMMON, *ARMS[name], *extra]
    print(f"[async_overlap] {name}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True)
    quickstart = json.loads(proc.stdout.strip().splitlines()[-1])
    record = arm_record(quickstart, read_metrics(folder / name / "run" / "metrics.jsonl"))
    record["load_after"] = os.getloadavg()[0]
    record["overrides"] = [*COMMON, *ARMS[name], *extra]
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS), help="arms to run (default all)")
    p.add_argument("--dir", default=None, help="run directories (default: a new temporary folder)")
    p.add_argument("--out", default=None, help="write the JSON there as well")
    p.add_argument("overrides", nargs="*", help="dotted overrides for every arm (smoke runs: run.iterations=2)")
    args = p.parse_args(argv)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="drmas-async-overlap-"))
    records: dict[str, dict[str, Any]] = {}
    for name in args.arms:  # --out is rewritten after each arm: an interrupted benchmark keeps the arms it finished
        records[name] = run_arm(name, folder, args.overrides)
        text = json.dumps({"arms": records, **compare(records), "cpus": len(os.sched_getaffinity(0))}, indent=1)
        if args.out:
            Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
