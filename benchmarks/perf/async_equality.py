"""Is ``run.mode: async`` at ``max_staleness: 0`` the synchronous run, on the real math quickstart? Trains
``quickstart_math`` for 2 iterations (SmolLM2-135M-Instruct, 4 tasks x 4 episodes each) in both modes and compares
every per-iteration metric of the rollout, rewards, advantages and update, and every weight of the final checkpoint::

    HF_HUB_OFFLINE=1 python benchmarks/perf/async_equality.py --out benchmarks/perf/data/async_equality.json
    HF_HUB_OFFLINE=1 python benchmarks/perf/async_equality.py --overlap false        # the interleaved schedule

The two runs are two processes started together, one torch thread each (the same kernels: a different thread count
changes float sums), without validation (``eval.every=0``, ``eval.before_train=false``: validation plays no part in
training). The async run uses the generation thread (``run.overlap=true``) unless ``--overlap false``.

Output (JSON): ``equal_metrics`` (every compared key equal with ``==``, but the engine log-prob diagnostics),
``compared_keys``, ``differing`` (key -> [sync, async] for any that differ), ``differing_diagnostics`` (the same for
the diagnostics of the engine's log-probs against the trainer's, :data:`ENGINE_DIAGNOSTICS`), ``equal_weights`` (``torch.equal`` on every tensor of every model),
``tensors``, ``max_abs_weight_diff``, wall time and load of each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

#: metric families that training determines (timings and the async loop's own bookkeeping are not compared)
COMPARED = ("rollout", "reward", "adv", "loss", "agent", "health", "version", "staleness")

#: diagnostics of the rollout engine's log-probs against the trainer's recompute (they train nothing unless
#: algorithm.behaviour_weight_cap is set): in async mode the engine is the generation side's copy of the weights,
#: whose log-probs were seen to differ from the trainer module's in the last bits (~1e-9) after a weight push
ENGINE_DIAGNOSTICS = ("old_logprob_abs_diff", "old_prob_abs_diff", "logprob_gap")


def compare_metrics(sync_rows: list[dict[str, Any]], async_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every key of the :data:`COMPARED` families, row by row: ``equal_metrics`` (all equal but the
    :data:`ENGINE_DIAGNOSTICS`), ``compared_keys``, ``differing`` and ``differing_diagnostics`` (``"<iteration>:<key>"
    -> [sync, async]``).

    Raises:
        ValueError: the runs logged different iterations.
    """
    if [r["iteration"] for r in sync_rows] != [r["iteration"] for r in async_rows]:
        raise ValueError("the runs logged different iterations")
    compared, differing, diagnostics = 0, {}, {}
    for s, a in zip(sync_rows, async_rows, strict=True):
        for k in s:
            if k.split("/")[0] in COMPARED:
                compared += 1
                if s[k] != a.get(k):
                    diagnostic = any(k.split("/")[-1].startswith(d) for d in ENGINE_DIAGNOSTICS)
                    (diagnostics if diagnostic else differing)[f"{s['iteration']}:{k}"] = [s[k], a.get(k)]
    return {"equal_metrics": not differing and compared > 0, "compared_keys": compared, "differing": differing,
            "differing_diagnostics": diagnostics}  # fmt: skip


def compare_weights(sync_dir: Path, async_dir: Path, iteration: int) -> dict[str, Any]:
    """``torch.equal`` over every tensor of every model of checkpoint ``iteration`` of both runs."""
    import torch

    from drmas_train.run.checkpoint import saved_model_weights

    a, b = (saved_model_weights(run / "checkpoints" / f"iter_{iteration:06d}") for run in (sync_dir, async_dir))
    same_keys = a.keys() == b.keys() and len(a) > 0
    equal = same_keys and all(torch.equal(a[k], b[k]) for k in a)
    diff = max((float((a[k].double() - b[k].double()).abs().max()) for k in a if k in b), default=float("nan"))
    return {"equal_weights": equal, "tensors": len(a), "max_abs_weight_diff": diff}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--overlap", choices=("true", "false"), default="true", help="the async run's run.overlap")
    p.add_argument("--dir", default=None, help="run directories (default: a new temporary folder)")
    p.add_argument("--out", default=None, help="write the JSON there as well")
    args = p.parse_args(argv)
    folder = Path(args.dir or tempfile.mkdtemp(prefix="drmas-async-equality-"))
    common = ["--config", "quickstart_math", "run.iterations=2", "run.num_threads=1", "eval.every=0",
              "eval.before_train=false", "run.progress=false", "run.plot=false", "run.tensorboard=false"]  # fmt: skip
    arms = {"sync": [], "async": ["run.mode=async", "run.max_staleness=0", f"run.overlap={args.overlap}"]}
    load, procs, started = os.getloadavg()[0], {}, time.perf_counter()
    for name, extra in arms.items():
        cmd = [sys.executable, "-m", "drmas_train.cli", "train", *common, f"run.dir={folder / name}", *extra]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    walls = {}
    for name, proc in procs.items():
        _, err = proc.communicate()
        walls[name] = round(time.perf_counter() - started, 1)
        if proc.returncode != 0:
            print(err[-3000:], file=sys.stderr)
            return proc.returncode
    from drmas_train.run.metrics_log import read_metrics

    out = {**compare_metrics(read_metrics(folder / "sync" / "metrics.jsonl"), read_metrics(folder / "async" / "metrics.jsonl")),
           **compare_weights(folder / "sync", folder / "async", 2), "async_overrides": arms["async"],
           "wall_time_s": walls, "load_average_before": load, "load_after": os.getloadavg()[0]}  # fmt: skip
    text = json.dumps(out, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if out["equal_metrics"] and out["equal_weights"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
