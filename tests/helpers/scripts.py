"""The repository's stand-alone files (``benchmarks/``, ``scripts/``) imported by path in the test process.

Those folders are no packages, so a test reaches a script's functions through :func:`load_script`
(``from helpers.scripts import load_script``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

#: The repository root: ``load_script``'s paths are relative to it.
ROOT = Path(__file__).resolve().parents[2]


def load_script(relative_path: str, name: str | None = None) -> ModuleType:
    """Execute the file ``ROOT / relative_path`` (e.g. ``"benchmarks/perf/async_sim.py"``) as a new module.

    The module is put in ``sys.modules`` under ``name`` (default: the file's stem, e.g. ``"async_sim"``) before its
    code runs, as ``import`` does: ``dataclasses`` and ``pickle`` find a class's module by that name. Every call runs
    the file again and replaces the module registered under ``name``; its ``if __name__ == "__main__":`` block does
    not run (``__name__`` is ``name``). Pass a ``name`` where the stem alone is ambiguous (``run``, ``theory``).

    Args:
        relative_path: the file's path from the repository root, ``/``-separated.
        name: the module's ``__name__`` and its ``sys.modules`` key.

    Returns:
        The executed module.

    Raises:
        FileNotFoundError: no file at ``ROOT / relative_path`` (the message names the path); nothing is registered.
        ValueError: the file is no Python source (no ``.py`` suffix); nothing is registered.
        Exception: whatever the file's own top-level code raises; ``name`` is removed from ``sys.modules`` again.
    """
    path = ROOT / relative_path
    if not path.is_file():
        raise FileNotFoundError(f"load_script: no file {path} (relative_path={relative_path!r})")
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"load_script: {path} is no Python source file (a .py path is accepted)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
