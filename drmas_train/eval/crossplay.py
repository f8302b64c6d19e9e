"""Cross-play: a team's score for every pairing of two roles' players, e.g. Solver checkpoints x Verifier checkpoints.

A cross-play grid has a *row role* and a *column role*, a list of players for each (a player is a model spec and a
label: "iter 4", "base", "iter 8 (verifier's model)"), and players fixed for the other roles of the env. Cell
``(i, j)`` is one ``drmas eval`` run (:func:`drmas_train.eval.evaluate.evaluate`, the one play loop) with row
player ``i`` and column player ``j``: the same :class:`~drmas_train.eval.evaluate.EvalConfig` (seeds, tasks,
sampling) with only ``agent_models`` and the label changed, so a cell equals a separate ``drmas eval --team`` of
the same assignment. Each cell is written as an ordinary results directory (``cells/r<i>_c<j>/``), a leaderboard
entry whose ``agent_models`` say which checkpoint played each role.

Outputs of :func:`run_crossplay` / :func:`write_heatmaps` (``out_dir``):

* ``crossplay.json``: the players, and per cell its results directory, label, ``agent_models`` and metrics
  (avg@k and pass@k with their standard errors over tasks, per env and data source); for a game (result rows with
  per-seat returns), ``ratings``: every player's openskill rating from the grid's episodes, each a match of its
  row player against its column player (:mod:`drmas_train.eval.ratings`), best first;
* ``crossplay_<env>_<source>.png``: heatmaps of avg@k (value ± SE in every cell) and pass@k;
* ``cells/``: the results directories (``drmas leaderboard <out>/cells`` ranks them).

A cell whose directory already holds a run of the same configuration is read, not played again, so an
interrupted cross-play continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drmas_train.eval.evaluate import EvalConfig, evaluate
from drmas_train.eval.ratings import crossplay_matches, rate_matches
from drmas_train.eval.results import ResultsError, config_hash, load_run

__all__ = ["Player", "CrossplayPlan", "cell_config", "run_crossplay", "write_heatmaps", "SCHEMA"]

#: ``crossplay.json``'s format tag.
SCHEMA = "drmas-crossplay/1"


@dataclasses.dataclass(frozen=True)
class Player:
    """One model playing one role.

    Attributes:
        label: its name on the grid's axis (e.g. ``"iter 4"``).
        model: what :attr:`EvalConfig.agent_models` takes: a model name or path, or a dict of
            :class:`~drmas_train.model.models.ModelSpec` fields.
        info: JSON-ready facts about it (iteration, model key, the role whose model it is, checkpoint).
    """

    label: str
    model: str | dict[str, Any]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "model": self.model, **({"info": self.info} if self.info else {})}


@dataclasses.dataclass(frozen=True)
class CrossplayPlan:
    """The grid: ``rows`` play ``row_role``, ``cols`` play ``col_role``, ``fixed`` the env's other roles.

    Raises:
        ValueError: the two roles are equal, a role of ``fixed`` is one of them, or a side has no player.
    """

    row_role: str
    rows: Sequence[Player]
    col_role: str
    cols: Sequence[Player]
    fixed: dict[str, Player] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.row_role == self.col_role:
            raise ValueError(f"cross-play needs two different roles, got {self.row_role!r} twice")
        if {self.row_role, self.col_role} & set(self.fixed):
            raise ValueError(
                f"roles {sorted({self.row_role, self.col_role} & set(self.fixed))} are both an axis and fixed"
            )
        if not self.rows or not self.cols:
            raise ValueError("cross-play needs at least one player per axis")


def cell_config(base: EvalConfig, plan: CrossplayPlan, i: int, j: int) -> EvalConfig:
    """The evaluation of cell ``(i, j)``: ``base`` with the cell's players (every role named, no ``"*"`` default)
    and the label ``"<row role>=<label>, <col role>=<label>[, <fixed role>=<label>...]"``."""
    row, col = plan.rows[i], plan.cols[j]
    players = {**plan.fixed, plan.row_role: row, plan.col_role: col}
    label = ", ".join(
        f"{role}={players[role].label}" for role in [plan.row_role, plan.col_role, *sorted(plan.fixed)]
    )
    return dataclasses.replace(base, policy="llm", model=None, label=label,
                               agent_models={role: p.model for role, p in players.items()})  # fmt: skip


def _cell(base: EvalConfig, plan: CrossplayPlan, i: int, j: int, folder: Path, progress: bool) -> Any:
    config = cell_config(base, plan, i, j)
    if (folder / "summary.json").is_file():
        run = load_run(folder)
        if run.summary.get("config_hash") == config_hash(config.to_dict()):
            return run  # played before with the same configuration
        raise ResultsError(
            f"{folder} holds another evaluation (its config differs from this cell's); give a new --out"
        )
    return evaluate(config, folder, progress=progress)


def _metrics(summary: dict[str, Any]) -> dict[str, Any]:
    """``{env: {source: {"avg@k": estimate, "pass@k": estimate or None, "num_tasks"}}}`` of a run's summary."""
    k = str(summary["k"])
    return {env: {src: {"avg@k": cell["avg@k"], "pass@k": cell["pass@k"].get(k), "num_tasks": cell["num_tasks"]}
                  for src, cell in cells.items()}
            for env, cells in summary["metrics"].items()}  # fmt: skip


def run_crossplay(
    base: EvalConfig, plan: CrossplayPlan, out_dir: str | Path, *, progress: bool = True
) -> dict[str, Any]:
    """Play every cell of ``plan`` (``base``'s tasks, seeds and sampling) and write ``crossplay.json``.

    Returns:
        the ``crossplay.json`` object.

    Raises:
        ValueError / ResultsError: a bad configuration, or a cell directory that holds another evaluation; model
        and env errors as :func:`~drmas_train.eval.evaluate.evaluate` raises them.
    """
    out = Path(out_dir)
    cells: list[list[dict[str, Any]]] = []
    episodes: list[list[list[dict[str, Any]]]] = []  # per cell, its result rows (games: the ratings' matches)
    for i in range(len(plan.rows)):
        row, played = [], []
        for j in range(len(plan.cols)):
            folder = out / "cells" / f"r{i}_c{j}"
            run = _cell(base, plan, i, j, folder, progress)
            row.append({"result_dir": str(folder.relative_to(out)), "label": run.summary["label"],
                        "agent_models": run.summary["agent_models"], "metrics": _metrics(run.summary)})  # fmt: skip
            played.append(run.episodes)
        cells.append(row)
        episodes.append(played)
    matrix = {
        "schema": SCHEMA,
        "roles": {"rows": plan.row_role, "cols": plan.col_role},
        "rows": [p.to_dict() for p in plan.rows],
        "cols": [p.to_dict() for p in plan.cols],
        "fixed": {role: p.to_dict() for role, p in plan.fixed.items()},
        "envs": list(base.envs),
        "data": list(base.data),
        "k": base.k,
        "seed": base.seed,
        "sampling": base.sampling,
        "cells": cells,
    }
    matches = crossplay_matches(matrix, episodes)  # games only: every episode is a match of a row and a col player
    if matches:
        matrix["ratings"] = [r.to_dict() for r in rate_matches(matches)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "crossplay.json").write_text(json.dumps(matrix, indent=2, default=str) + "\n")
    return matrix


def _grid(
    matrix: dict[str, Any], env: str, source: str, metric: str
) -> tuple[list[list[float]], list[list[float]]]:
    values, errors = [], []
    for row in matrix["cells"]:
        vals, errs = [], []
        for cell in row:
            est = cell["metrics"].get(env, {}).get(source, {}).get(metric)
            vals.append(float("nan") if est is None else est["value"])
            errs.append(float("nan") if est is None or est["stderr"] is None else est["stderr"])
        values.append(vals)
        errors.append(errs)
    return values, errors


def write_heatmaps(matrix: dict[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per (env, data source) of ``matrix``: avg@k (each cell ``value ± SE``) and pass@k side by side,
    rows = the row role's players, columns = the column role's; the env's ``overall`` only when it has several
    sources.

    Returns:
        the written paths (``crossplay_<env>_<source>.png``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out, k = Path(out_dir), matrix["k"]
    rows = [p["label"] for p in matrix["rows"]]
    cols = [p["label"] for p in matrix["cols"]]
    pairs = sorted({(env, src) for row in matrix["cells"] for cell in row for env, srcs in cell["metrics"].items()
                    for src in srcs if src != "overall" or len(srcs) > 2})  # overall = the one source: drawn once  # fmt: skip
    written = []
    for env, source in pairs:
        fig, axes = plt.subplots(1, 2, figsize=(4 + 2.4 * len(cols), 1.5 + 0.9 * len(rows)), squeeze=False)
        for ax, metric, name in ((axes[0][0], "avg@k", f"avg@{k}"), (axes[0][1], "pass@k", f"pass@{k}")):
            values, errors = _grid(matrix, env, source, metric)
            image = ax.imshow(
                np.asarray(values, dtype=float), vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto"
            )
            for i, row in enumerate(values):
                for j, v in enumerate(row):
                    se = errors[i][j]
                    text = "—" if v != v else (f"{v:.2f}" + ("" if se != se else f"\n± {se:.2f}"))
                    ax.text(
                        j,
                        i,
                        text,
                        ha="center",
                        va="center",
                        fontsize=9,
                        color="white" if v < 0.6 else "black",
                    )
            ax.set_xticks(range(len(cols)), cols, rotation=20, ha="right")
            ax.set_yticks(range(len(rows)), rows)
            ax.set(
                xlabel=matrix["roles"]["cols"],
                ylabel=matrix["roles"]["rows"],
                title=f"{name} (± SE over tasks)",
            )
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        fixed = ", ".join(f"{r}={p['label']}" for r, p in sorted(matrix["fixed"].items()))
        fig.suptitle(f"cross-play · {env} · {source}" + (f" · fixed: {fixed}" if fixed else ""))
        fig.tight_layout()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{env}_{source}")
        path = out / f"crossplay_{safe}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
