"""``drmas leaderboard RESULTS_DIR... --out DIR``: rank eval runs into Markdown, HTML and PNG tables.

Each RESULTS_DIR is a directory written by ``drmas eval``, or a directory whose immediate subdirectories are.
Writes ``DIR/leaderboard.md``, ``DIR/leaderboard.html`` (self-contained, sortable), ``DIR/leaderboard.json`` and
``DIR/leaderboard_<suite>.png``. Exit code 2, with the reason, when runs cannot be ranked together (different k
or env versions) or a directory is not a valid results directory (e.g. an older schema version).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from drmas_train.commands import HelpFormatter

__all__ = ["main", "build_parser", "expand_dirs"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas leaderboard``."""
    p = argparse.ArgumentParser(
        prog="drmas leaderboard",
        description="Aggregate 'drmas eval' results into ranked tables per suite (Markdown, HTML, PNG).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("results", nargs="+", metavar="RESULTS_DIR", help="run directories (or parents of run dirs)")
    p.add_argument("--out", required=True, help="output directory (its earlier leaderboard files are replaced)")
    p.add_argument("--title", default="drmas leaderboard", help="page title")
    p.add_argument("--no-png", action="store_true", help="skip the matplotlib bar charts")
    return p


def expand_dirs(paths: list[str]) -> list[Path]:
    """Run directories: each path itself if it holds ``summary.json``, else its subdirectories that do (sorted).

    Raises:
        FileNotFoundError: a path that does not exist or holds no run at all.
    """
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / "summary.json").is_file():
            out.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"results directory {path} does not exist")
        runs = sorted(d for d in path.iterdir() if (d / "summary.json").is_file())
        if not runs:
            raise FileNotFoundError(f"{path} holds no 'drmas eval' run (no summary.json in it or its subdirectories)")
        out.extend(runs)
    return out


def main(argv: list[str]) -> int:
    """Entry point of ``drmas leaderboard``; returns the exit code (2 when the runs cannot be ranked)."""
    args = build_parser().parse_args(argv)
    from drmas_train.eval.leaderboard import LeaderboardError, write_leaderboard
    from drmas_train.eval.results import ResultsError, load_run

    try:
        runs = [load_run(d, episodes=False) for d in expand_dirs(args.results)]
        written = write_leaderboard(runs, args.out, title=args.title, png=not args.no_png)
    except (FileNotFoundError, ResultsError, LeaderboardError) as err:
        print(f"drmas leaderboard: {err}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name:<12} {path}")
    return 0
