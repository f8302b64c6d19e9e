"""How many public names several modules export (issue 41: "115 names are exported from two or more modules").

For every module of drmas_envs and drmas_train (walked with pkgutil, each imported), each name of its ``__all__``
is counted once per module that lists it (``below_the_top_levels``: the same count with the two top-level packages,
whose re-exports are the public API of docs/python-api.md, left out). Prints JSON: the names listed by two or more modules, split into
re-exports (every module's name is the same object) and homonyms (different objects under one name, e.g. each
env module's ``env``), with the modules of each.

    HF_HUB_OFFLINE=1 python benchmarks/api/exports.py
"""

from __future__ import annotations

import collections
import importlib
import json
import pkgutil


def exporters(packages: tuple[str, ...] = ("drmas_envs", "drmas_train")) -> dict[str, list[tuple[str, object]]]:
    """Name -> [(module, object)] of every module whose ``__all__`` lists it."""
    found: dict[str, list[tuple[str, object]]] = collections.defaultdict(list)
    for top in packages:
        package = importlib.import_module(top)
        for name in [top, *(m.name for m in pkgutil.walk_packages(package.__path__, top + "."))]:
            module = importlib.import_module(name)
            for public in getattr(module, "__all__", ()):
                found[public].append((name, getattr(module, public, None)))
    return found


def main() -> None:
    """Print the counts and the names as JSON."""
    multi = {n: v for n, v in exporters().items() if len(v) > 1}
    same = {n: [m for m, _ in v] for n, v in multi.items() if all(o is v[0][1] for _, o in v)}
    homonyms = {n: [m for m, _ in v] for n, v in multi.items() if n not in same}
    below_top = [n for n, v in multi.items() if sum(m not in ("drmas_envs", "drmas_train") for m, _ in v) > 1]
    print(json.dumps({"names_in_two_or_more_all": len(multi), "re_exports": len(same), "homonyms": len(homonyms),
                      "listings": sum(len(v) for v in multi.values()),
                      "below_the_top_levels": len(below_top),  # the public top-level facades left out
                      "re_export_modules": same, "homonym_modules": homonyms}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
