"""What the game quickstart's training runs did: per run, the paired return gain over iteration 0 at each validation
(± SE), the share of the learner's replies that were a valid ``<action>`` per iteration, and the most common reply.

Reads finished run directories of ``drmas train --config quickstart_kuhn`` (``metrics.jsonl``, ``samples/``,
``summary.json``); prints one JSON object (and writes it to ``--out``)::

    python benchmarks/games/quickstart_runs.py runs/kuhn/seed0 runs/kuhn/seed1 runs/kuhn/seed2 --out runs.json

Run it on runs made with ``run.save_samples: true`` (the preset's default).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
from pathlib import Path
from typing import Any


def run_record(run_dir: Path, opponent: str = "random-v0") -> dict[str, Any]:
    """One run's validations (``return``, ``return_gain`` ± SE) and per-iteration reply validity."""
    summary = json.loads((run_dir / "summary.json").read_text())
    validations = {}
    for it, m in sorted(summary["validation"].items(), key=lambda kv: int(kv[0])):
        row = {"return": m.get(f"val/{opponent}/all/return"), "return_se": m.get(f"val/{opponent}/all/return_se")}
        if f"val/{opponent}/return_gain" in m:
            row |= {"gain": m[f"val/{opponent}/return_gain"], "gain_se": m[f"val/{opponent}/return_gain_se"]}
        validations[it] = row
    replies = {}
    for path in sorted((run_dir / "samples").glob("iter_*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        top = collections.Counter(r["response_text"].strip()[:40] for r in rows).most_common(1)[0]
        replies[str(int(path.stem.split("_")[1]))] = {"calls": len(rows),
                                                      "valid": sum(bool(r["is_action_valid"]) for r in rows),
                                                      "top_reply": top[0], "top_count": top[1]}  # fmt: skip
    seed = next((int(line.split(":", 1)[1]) for line in (run_dir / "config.yaml").read_text().splitlines()
                 if line.startswith("seed:")), None)  # fmt: skip
    return {"seed": seed, "validations": validations, "replies": replies,
            "wall_time_s": round(summary["wall_time_s"], 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--opponent", default="random-v0")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    runs = {str(p): run_record(p, args.opponent) for p in args.runs}
    last = [r["validations"][max(r["validations"], key=int)] for r in runs.values()]
    gains = [v["gain"] for v in last if "gain" in v]
    result = {"runs": runs, "final_gain_per_run": gains,
              "final_gain_mean": statistics.fmean(gains) if gains else None,
              "final_gain_se_over_runs": statistics.stdev(gains) / len(gains) ** 0.5 if len(gains) > 1 else None}  # fmt: skip
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
