"""Which role's training carried a team's gain: paired per-task differences between ``drmas crossplay`` cells.

Reads one or more ``drmas crossplay`` output folders (``crossplay.json`` and each cell's ``episodes.jsonl``). A cell
is an assignment of players to roles (``{"verifier": "base", "search": "iter 8", "answer": "base"}``: each role's
player label; the fixed roles included). Two cells that differ in exactly one role's player make a **paired
effect** of that role: over the tasks both played, the per-task difference of the mean ``won`` over the k samples
(``to`` cell minus ``from`` cell), mean ± SE over tasks (sample std, ddof 1, / sqrt(n);
``drmas_train.eval.metrics.mean_stderr``). Several folders together cover a factorial design (e.g. a Verifier x
Answer grid with the Search agent fixed at ``base`` and another with it at ``iter 8``). A cell played twice (the
same assignment in two folders) is kept once, the first.

Prints one JSON object:

* ``cells``: per cell its assignment, avg@k ± SE over tasks, and per agent the valid-call share and calls per
  episode (``drmas_train.eval.metrics.per_agent_stats``);
* ``effects``: per role, every ``from`` -> ``to`` pair of its players (from the earlier training iteration to the
  later, so ``base`` -> ``iter 8``) in every context of the other roles: the paired difference ± SE and the
  number of tasks.

    python benchmarks/crossplay/paired.py runs/crossplay/search_s8 runs/crossplay/search_s0

Raises (exit 2 with one line): a folder without ``crossplay.json``, or a cell that is not a complete results directory.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

from drmas_train.eval.metrics import group_correct, mean_stderr, per_agent_stats
from drmas_train.eval.results import load_run


def _iteration(player: dict[str, Any]) -> int:
    """A crossplay player's training iteration (``info.iteration``; 0 = the base model)."""
    return int((player.get("info") or {}).get("iteration", 0))


def load_cells(folders: list[str | Path]) -> tuple[list[str], list[dict[str, Any]]]:
    """The roles (in first-seen order) and the cells of crossplay ``folders``.

    Returns:
        ``(roles, cells)``; each cell is ``{"assignment": {role: label}, "scores": {task_id: mean won},
        "episodes": [rows], "folder": str, "iteration": {role: its player's training iteration}}``.

    Raises:
        FileNotFoundError: a folder without ``crossplay.json``.
        ResultsError: a cell that is not a complete results directory (:func:`drmas_train.eval.results.load_run`).
    """
    roles: list[str] = []
    cells: list[dict[str, Any]] = []
    seen: set[tuple[tuple[str, str], ...]] = set()
    for folder in map(Path, folders):
        meta_path = folder / "crossplay.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: no such file (give 'drmas crossplay' output folders)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        row_role, col_role = meta["roles"]["rows"], meta["roles"]["cols"]
        fixed = {role: player["label"] for role, player in meta["fixed"].items()}
        fixed_it = {role: _iteration(player) for role, player in meta["fixed"].items()}
        for role in (row_role, col_role, *fixed):
            if role not in roles:
                roles.append(role)
        for i, row in enumerate(meta["cells"]):
            for j, cell in enumerate(row):
                assignment = {row_role: meta["rows"][i]["label"], col_role: meta["cols"][j]["label"], **fixed}
                key = tuple(sorted(assignment.items()))
                if key in seen:
                    continue
                seen.add(key)
                episodes = load_run(folder / cell["result_dir"]).episodes  # a drmas eval results directory
                won = group_correct(episodes, "won")
                cells.append({"assignment": assignment, "episodes": episodes, "folder": str(folder),
                              "scores": {t: sum(map(float, v)) / len(v) for t, v in won.items()},
                              "iteration": {row_role: _iteration(meta["rows"][i]), col_role: _iteration(meta["cols"][j]),
                                            **fixed_it}})  # fmt: skip
    return roles, cells


def paired_effects(roles: list[str], cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pair of cells that differ in exactly one role's player: the paired per-task difference.

    The pair's direction goes from the earlier training iteration to the later one (``base`` = 0 first; equal
    iterations, e.g. a swapped-in model, by label). Pairs with no common task are skipped.
    """
    out: list[dict[str, Any]] = []
    for a, b in combinations(cells, 2):
        differ = [r for r in roles if a["assignment"].get(r) != b["assignment"].get(r)]
        if len(differ) != 1:
            continue
        role = differ[0]
        key_a = (a["iteration"][role], a["assignment"][role])
        key_b = (b["iteration"][role], b["assignment"][role])
        lo, hi = (a, b) if key_a <= key_b else (b, a)
        tasks = [t for t in lo["scores"] if t in hi["scores"]]
        if not tasks:
            continue
        est = mean_stderr(hi["scores"][t] - lo["scores"][t] for t in tasks)
        out.append({"role": role, "from": lo["assignment"][role], "to": hi["assignment"][role],
                    "context": {r: lo["assignment"][r] for r in roles if r != role},
                    "diff": est.value, "stderr": est.stderr, "tasks": est.n})  # fmt: skip
    return sorted(
        out, key=lambda e: (roles.index(e["role"]), [e["context"][r] for r in roles if r != e["role"]])
    )


def summarize(folders: list[str | Path]) -> dict[str, Any]:
    """The JSON object this script prints (module docstring)."""
    roles, cells = load_cells(folders)
    rows = []
    for cell in cells:
        est = mean_stderr(cell["scores"].values())
        agents = per_agent_stats(cell["episodes"])
        rows.append({"assignment": cell["assignment"], "avg@k": est.value, "stderr": est.stderr, "tasks": est.n,
                     "agents": {a: {"valid_call_share": s["valid_action_rate"], "calls_per_episode": s["calls"]}
                                for a, s in agents.items()}})  # fmt: skip
    return {"benchmark": "crossplay_paired", "folders": [str(f) for f in folders], "roles": roles, "cells": rows,
            "effects": paired_effects(roles, cells)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+", help="'drmas crossplay' output folders (their --out)")
    args = p.parse_args(argv)
    try:
        out = summarize(args.folders)
    except (FileNotFoundError, KeyError, ValueError) as err:  # ResultsError is a ValueError
        print(f"paired.py: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
