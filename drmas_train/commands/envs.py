"""``drmas envs``: list the registered environments (``drmas_envs.pprint_registry``)."""

from __future__ import annotations

import argparse

from drmas_train.commands import HelpFormatter

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``drmas envs``."""
    parser = argparse.ArgumentParser(prog="drmas envs", description="List the registered drmas environments.",
                                     formatter_class=HelpFormatter)  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="also print entry points and default kwargs")
    return parser


def main(argv: list[str]) -> int:
    """Print every registered env id grouped by namespace (``--verbose``: entry points and default kwargs too)."""
    args = build_parser().parse_args(argv)
    import drmas_envs

    if args.verbose:
        print("\n\n".join(spec.pprint() for _, spec in sorted(drmas_envs.registry.items())))
    else:
        drmas_envs.pprint_registry()
    return 0
