"""``drmas data list | prepare <recipe> | verify <dir>``: build the paper's data sets from downloaded files.

    drmas data list                                       # recipes, the files each needs and how to fetch them
    drmas data prepare drmas_math --raw data/raw --out data/drmas_math
    drmas data verify data/drmas_math                     # re-hash against MANIFEST.json

All logic lives in :mod:`drmas_train.data.prepare` (machinery) and :mod:`drmas_train.data.recipes` (the recipes);
this module parses arguments and maps errors to exit codes: 0 success, 1 ``verify`` found changed files, 2 a user
mistake (unknown recipe, missing file, existing outputs).
"""

from __future__ import annotations

import argparse
import sys

from drmas_train.commands import HelpFormatter
from drmas_train.data.prepare import get_recipe, prepare, verify
from drmas_train.data.recipe import DataPrepError, find_input
from drmas_train.data.recipes import RECIPES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="drmas data", description="Build the Dr. MAS reference's data sets from downloaded files.",
                                epilog=__doc__.split("\n\n")[1], formatter_class=HelpFormatter)  # fmt: skip
    sub = p.add_subparsers(dest="action", required=True)
    ls = sub.add_parser("list", formatter_class=HelpFormatter, help="list the recipes and the raw files each needs")
    ls.add_argument("--raw", default="data/raw", help="raw directory to check for the files")
    prep = sub.add_parser("prepare", formatter_class=HelpFormatter, help="build a recipe's files and MANIFEST.json")
    prep.add_argument("recipe", help=f"one of {sorted(RECIPES)}")
    prep.add_argument("--raw", default="data/raw", help="directory holding the downloaded files")
    prep.add_argument("--out", default=None, help="output directory (default data/<recipe>)")
    prep.add_argument("--force", action="store_true", help="replace the outputs of an earlier run")
    ver = sub.add_parser("verify", formatter_class=HelpFormatter, help="re-hash a prepared directory against its MANIFEST.json")
    ver.add_argument("dir", help="a directory written by 'drmas data prepare'")
    ver.add_argument("--outputs-only", action="store_true", help="do not re-hash the recorded raw inputs")
    return p


def _list(raw: str) -> int:
    from pathlib import Path

    for recipe in RECIPES.values():
        print(f"{recipe.name}: {recipe.description}\n  reference: {recipe.reference}")
        for spec in recipe.inputs:
            try:
                status = f"found {find_input(spec, Path(raw))}"
            except DataPrepError:
                status = "missing; fetch: " + spec.fetch.format(raw=raw)
            print(f"  - {spec.name} ({spec.origin}): {status}")
    return 0


def main(argv: list[str]) -> int:
    """Entry point; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        if args.action == "list":
            return _list(args.raw)
        if args.action == "prepare":
            recipe = get_recipe(args.recipe)
            out = args.out or f"data/{recipe.name}"
            manifest = prepare(recipe, args.raw, out, force=args.force, progress=True)
            for name, rec in manifest["outputs"].items():
                sources = rec.get("data_sources")
                detail = f"{rec['rows']} rows" + (f" {sources}" if sources else "") if rec["rows"] else f"{rec['bytes']} bytes"
                print(f"{out}/{name}: {detail}, sha256 {rec['sha256']}")
            print(f"manifest: {out}/MANIFEST.json")
            if recipe.next_steps:
                print(recipe.next_steps.format(out=out))
            return 0
        problems = verify(args.dir, check_inputs=not args.outputs_only)
    except DataPrepError as err:
        print(f"drmas data: {err}", file=sys.stderr)
        return 2
    for line in problems:
        print(f"drmas data verify: {line}", file=sys.stderr)
    if not problems:
        print(f"{args.dir}: all files match MANIFEST.json")
    return 1 if problems else 0
