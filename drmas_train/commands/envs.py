"""``drmas envs``: list the registered environments (``drmas_envs.pprint_registry``)."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    """Print every registered env id grouped by namespace (``--verbose``: entry points and default kwargs too)."""
    parser = argparse.ArgumentParser(prog="drmas envs", description="List the registered drmas environments.")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print entry points and default kwargs")
    args = parser.parse_args(argv)
    import drmas_envs

    if args.verbose:
        print("\n\n".join(spec.pprint() for _, spec in sorted(drmas_envs.registry.items())))
    else:
        drmas_envs.pprint_registry()
    return 0
