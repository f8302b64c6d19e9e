"""drmas_train is grouped by the stages of the data flow; the old flat module paths still import.

Stages, earliest first: model (+ backends) -> collect -> algorithm -> eval -> run (+ distributed) -> commands/cli.
A module may import its own stage and earlier ones, never a later one (docs/architecture.md, Package layout).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import drmas_train
from drmas_train import MOVED_MODULES

PACKAGE = Path(drmas_train.__file__).resolve().parent

# Sub-package (first component under drmas_train) -> rank of its stage.
STAGE_RANK = {
    "model": 0,
    "backends": 0,
    "collect": 1,
    "algorithm": 2,
    "eval": 3,
    "run": 4,
    "distributed": 4,
    "integrations": 5,
    "commands": 5,
    "cli": 5,
}


def test_old_paths_are_the_moved_modules():
    for old, stage in MOVED_MODULES.items():
        legacy = importlib.import_module(f"drmas_train.{old}")
        moved = importlib.import_module(f"drmas_train.{stage}.{old}")
        assert legacy is moved, old
        assert getattr(drmas_train, old) is moved, old
        for name in getattr(moved, "__all__", []):
            assert getattr(legacy, name) is getattr(moved, name), f"drmas_train.{old}.{name}"


def test_old_path_examples():
    from drmas_train.algorithm.advantages import get_estimator
    from drmas_train.collect.samples import Sample
    from drmas_train.run.trainer import train

    old_advantages = importlib.import_module("drmas_train.advantages")
    assert old_advantages.get_estimator is get_estimator
    assert importlib.import_module("drmas_train.samples").Sample is Sample
    assert Sample.__module__ == "drmas_train.collect.samples"  # pickles name the new path
    assert importlib.import_module("drmas_train.trainer").train is train
    # the module keeps its own spec, so importlib.reload() and tracebacks find its file
    assert old_advantages.__spec__.name == "drmas_train.algorithm.advantages"
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("drmas_train.no_such_module")


def test_every_stage_module_is_listed_and_nothing_is_left_flat():
    on_disk = {
        p.stem: p.parent.name for p in PACKAGE.glob("*/*.py") if p.parent.name in set(MOVED_MODULES.values())
    }
    on_disk = {k: v for k, v in on_disk.items() if k != "__init__"}
    assert on_disk == MOVED_MODULES
    flat = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert flat == ["__init__", "cli"]


def _stage(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "drmas_train" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in STAGE_RANK else MOVED_MODULES.get(parts[1])


def _imports(path: Path) -> set[str]:
    """Every drmas_train module a file imports, at any depth (function-level and TYPE_CHECKING imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "drmas_train":
                found.update(f"drmas_train.{a.name}" for a in node.names if not a.name.startswith("_"))
    return {m for m in found if m.split(".")[0] == "drmas_train"}


def test_imports_point_one_way():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        importer = _stage(".".join(rel.parts))
        if importer is None:
            continue
        for imported in sorted(_imports(path)):
            stage = _stage(imported)
            if stage is not None and STAGE_RANK[stage] > STAGE_RANK[importer]:
                wrong.append(f"{'/'.join(rel.parts)}.py ({importer}) imports {imported} ({stage})")
    assert not wrong, "\n".join(wrong)


def test_eval_uses_only_models_and_collect():
    for path in (PACKAGE / "eval").glob("*.py"):
        stages = {_stage(m) for m in _imports(path)} - {None}
        assert stages <= {"model", "backends", "collect", "eval"}, (path.name, stages)


def test_stage_modules_use_new_paths():
    """Inside the package every import names the new path (the aliases are for users, not for drmas_train)."""
    old = [
        f"{path.relative_to(PACKAGE.parent)} imports {m}"
        for path in PACKAGE.rglob("*.py")
        for m in _imports(path)
        if m.split(".")[1:2] and m.split(".")[1] in MOVED_MODULES
    ]
    assert not old, "\n".join(old)
