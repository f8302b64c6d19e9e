"""``drmas crossplay``: evaluate a grid of teams from a training run's checkpoints, e.g. Solver x Verifier iterations.

Examples::

    drmas crossplay --run runs/quickstart_math --iterations 0,4,8 --k 4 --out runs/crossplay/math
                                                             # solver checkpoints x verifier checkpoints
    drmas crossplay --run runs/search --roles verifier,answer --fixed search=latest --swaps --out runs/crossplay/search

The run's ``config.yaml`` says which model key each role uses; iteration 0 is the initial model, iteration N the
checkpoint ``checkpoints/iter_<N>`` (each one must still be there: train with ``run.save_every`` and a
``run.keep_checkpoints`` large enough). The env, its arguments, the sampling and the length limits default to the
run's own (as ``drmas eval --preset <run>/config.yaml``); flags win. Without ``--data`` the tasks are the run's own
validation tasks (held out from its training tasks), rebuilt from its config and written to
``OUT/validation_tasks.jsonl``. ``--swaps`` adds the other roles' models in
each role (only models of the same base: architecture and tokenizer). Writes ``OUT/crossplay.json``,
``OUT/crossplay_<env>_<source>.png`` (avg@k and pass@k heatmaps), ``OUT/cells/r<i>_c<j>/`` (one ``drmas eval``
results directory per cell) and ``OUT/leaderboard/``; for a game (e.g. ``--roles player_0,player_1``), every
checkpoint's openskill rating from the grid's episodes, in ``crossplay.json`` and as the leaderboard's last section
(next to each player's win rate, its avg@k).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from drmas_train.commands import HelpFormatter
from drmas_train.commands.eval import add_play_arguments

__all__ = ["main", "build_parser", "plan_from_args"]


def _iterations(text: str) -> list[int]:
    try:
        its = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected iterations like 0,4,8, got {text!r}") from None
    if not its or any(i < 0 for i in its):
        raise argparse.ArgumentTypeError(f"expected iterations >= 0 like 0,4,8, got {text!r}")
    return sorted(set(its))


def _pair(text: str) -> tuple[str, str]:
    role, sep, value = text.partition("=")
    if not sep or not role or not value:
        raise argparse.ArgumentTypeError(f"expected ROLE=ITERATION|base|latest, got {text!r}")
    return role, value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas crossplay``."""
    p = argparse.ArgumentParser(
        prog="drmas crossplay",
        description="Cross-play a training run's checkpoints: one role's players x another's, avg@k ± SE and pass@k "
                    "per cell, heatmaps, and a 'drmas eval' results directory per cell. The run's config.yaml is the "
                    "preset of the options below (its env, env arguments, validation sampling and length limits), "
                    "and without --data the tasks are the run's own held-out validation tasks.",
        formatter_class=HelpFormatter,
    )  # fmt: skip
    p.add_argument(
        "--run", required=True, metavar="RUN_DIR", help="a 'drmas train' run directory (its run.dir)"
    )
    p.add_argument(
        "--iterations",
        type=_iterations,
        default=None,
        metavar="0,4,8",
        help="iterations whose models play (0 = the initial model); default: 0 and every kept checkpoint",
    )
    p.add_argument(
        "--roles",
        default=None,
        metavar="ROW,COL",
        help="the two roles on the grid's axes; default: the run's first two agents",
    )
    p.add_argument(
        "--fixed",
        action="append",
        default=[],
        type=_pair,
        metavar="ROLE=ITERATION",
        help="the model of a role off the axes: an iteration, base (= 0) or latest; default: the last of "
        "--iterations; repeat",
    )
    p.add_argument(
        "--swaps",
        action="store_true",
        help="also let each axis role be played by the other roles' models (same base model only)",
    )
    add_play_arguments(p, presets=False)
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="local generation backend")
    p.add_argument(
        "--out", required=True, help="output directory (cells already played with the same settings are kept)"
    )
    return p


def _players(run: Any, role: str, iterations: list[int], swaps: bool, notes: list[str]) -> list[Any]:
    from drmas_train.eval.crossplay import Player
    from drmas_train.run.run_models import role_model, same_family

    def player(it: int, by: str | None) -> Player:
        label = "base" if it == 0 else f"iter {it}"
        model = role_model(run, role, it, played_by=by)  # raises for an iteration without a checkpoint
        info = {"iteration": it, "model": run.model_name(by or role), "model_of": by or role}
        if it:
            info["checkpoint"] = str(run.checkpoints[it])
        return Player(label if by is None else f"{label} ({by}'s model)", model, info)

    out = [player(it, None) for it in iterations]
    if swaps:
        for other in run.roles:
            if other == role or run.model_name(other) == run.model_name(role):
                continue  # the same model: nothing to swap
            if not same_family(run, role, other):
                notes.append(f"no swap of {other}'s model into {role}: another base model")
                continue
            out += [player(it, other) for it in iterations if it > 0]  # iteration 0: the same base as its own
    return out


def plan_from_args(args: argparse.Namespace) -> tuple[Any, Any, list[str]]:
    """``(run, CrossplayPlan, notes)`` of parsed arguments.

    Raises:
        RunModelsError: an unknown run, role or iteration (the message says what the run has).
    """
    from drmas_train.eval.crossplay import CrossplayPlan, Player
    from drmas_train.run.run_models import RunModelsError, open_run, role_model

    run = open_run(args.run)
    iterations = args.iterations if args.iterations is not None else [0, *sorted(run.checkpoints)]
    roles = [r.strip() for r in args.roles.split(",")] if args.roles else run.roles[:2]
    if len(roles) != 2 or roles[0] == roles[1]:
        raise RunModelsError(
            f"--roles takes two different roles ROW,COL of the run's agents {run.roles}, got {args.roles!r}"
        )
    for role in roles:
        run.model_name(role)
    notes: list[str] = []
    rows = _players(run, roles[0], iterations, args.swaps, notes)
    cols = _players(run, roles[1], iterations, args.swaps, notes)
    given = dict(args.fixed)
    fixed = {}
    for role in run.roles:
        if role in roles:
            if role in given:
                raise RunModelsError(f"--fixed {role}=...: {role} is on an axis (--roles {','.join(roles)})")
            continue
        value = given.pop(role, "latest")
        if value == "latest":
            it = max(iterations)
        elif value == "base":
            it = 0
        elif value.isdigit():
            it = int(value)
        else:
            raise RunModelsError(f"--fixed {role}={value!r}: accepted: an iteration, base or latest")
        fixed[role] = Player("base" if it == 0 else f"iter {it}", role_model(run, role, it),
                             {"iteration": it, "model": run.model_name(role)})  # fmt: skip
    if given:
        raise RunModelsError(
            f"--fixed names roles {sorted(given)} that the run does not have; its agents: {run.roles}"
        )
    return run, CrossplayPlan(roles[0], rows, roles[1], cols, fixed), notes


def _table(matrix: dict[str, Any]) -> str:
    """The avg@k ± SE grid of the first (env, source), as console text."""
    first = matrix["cells"][0][0]["metrics"]
    env = next(iter(first))
    source = next(iter(first[env]))
    cols = [c["label"] for c in matrix["cols"]]
    width = max(len(r["label"]) for r in matrix["rows"]) + 2
    lines = [f"avg@{matrix['k']} ± SE · {env} · {source} · rows: {matrix['roles']['rows']}, columns: {matrix['roles']['cols']}",
             " " * width + "".join(f"{c:>22}" for c in cols)]  # fmt: skip
    for row, cells in zip(matrix["rows"], matrix["cells"], strict=True):
        parts = []
        for cell in cells:
            est = cell["metrics"][env][source]["avg@k"]
            parts.append(f"{est['value']:.3f} ± {est['stderr'] or 0.0:.3f}")
        lines.append(f"{row['label']:<{width}}" + "".join(f"{p:>22}" for p in parts))
    return "\n".join(lines)


def validation_tasks_of_run(args: argparse.Namespace) -> str | None:
    """Without ``--data``: make ``args`` play the run's own validation tasks, and return a note saying which
    (:func:`drmas_train.commands.eval.validation_tasks_of` with the run's ``config.yaml``).

    Raises:
        ConfigError: the run's config or its task source does not load.
    """
    from drmas_train.commands.eval import validation_tasks_of

    return validation_tasks_of(args, str(Path(args.run) / "config.yaml"))


def main(argv: list[str]) -> int:
    """Entry point of ``drmas crossplay``; returns the exit code (2 on bad arguments, one line on stderr)."""
    args = build_parser().parse_args(argv)
    args.preset = None
    from drmas_train.commands.eval import check_counts, config_from_args
    from drmas_train.eval.crossplay import cell_config

    try:  # everything about the arguments is checked before a model loads
        check_counts(args)
        run, plan, notes = plan_from_args(args)
        if (note := validation_tasks_of_run(args)) is not None:
            notes.append(note)
        args.preset = str(
            Path(args.run) / "config.yaml"
        )  # the run's env, sampling and limits are the defaults
        first = {**{r: p.model for r, p in plan.fixed.items()}, plan.row_role: plan.rows[0].model,
                 plan.col_role: plan.cols[0].model}  # fmt: skip
        base = config_from_args(args, agent_models=first)
        cell_config(base, plan, 0, 0)
    except ValueError as err:  # RunModelsError, ConfigError, EvalConfig's checks
        print(f"drmas crossplay: {err}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    for note in notes:
        print(f"drmas crossplay: {note}", file=sys.stderr)
    from drmas_envs.registration import RegistrationError
    from drmas_train.eval.crossplay import run_crossplay, write_heatmaps
    from drmas_train.eval.evaluate import EvalInputError
    from drmas_train.eval.leaderboard import LeaderboardError, write_leaderboard
    from drmas_train.eval.ratings import PlayerRating, ratings_markdown
    from drmas_train.eval.results import ResultsError, load_run
    from drmas_train.model.assignment import AssignmentError
    from drmas_train.model.models import ModelNotFoundError

    expected = (
        ResultsError,
        RegistrationError,
        FileNotFoundError,
        AssignmentError,
        ModelNotFoundError,
        LeaderboardError,
        EvalInputError,
    )
    try:
        matrix = run_crossplay(base, plan, args.out, progress=not args.no_progress)
        pngs = write_heatmaps(matrix, args.out)
        cells = [load_run(Path(args.out) / c["result_dir"]) for row in matrix["cells"] for c in row]
        ratings = [PlayerRating(**r) for r in matrix.get("ratings", [])]  # games: players ranked by rating
        write_leaderboard(cells, Path(args.out) / "leaderboard", title=f"cross-play of {run.name}", png=False,
                          ratings=ratings)  # fmt: skip
    except expected as err:  # user errors: say what is wrong, no traceback
        print(f"drmas crossplay: {err}", file=sys.stderr)
        return 2
    print(_table(matrix))
    if ratings:
        print(ratings_markdown(ratings), end="")
    print(f"wrote {Path(args.out) / 'crossplay.json'}, {', '.join(str(p) for p in pngs)} and "
          f"{len(cells)} results directories under {Path(args.out) / 'cells'}")  # fmt: skip
    return 0
