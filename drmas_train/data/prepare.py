"""Machinery of ``drmas data prepare``: recipes of raw files -> prepared files, checksums and the manifest.

A :class:`Recipe` names the raw files it reads (:class:`RecipeInput`: where each comes from and the command that
fetches it) and a ``build`` function; :func:`prepare` locates every input (naming each missing one at once), checks
pinned hashes, builds into a temporary directory, moves the outputs in and writes ``MANIFEST.json`` (SHA-256, size
and rows of every input and output); :func:`verify` re-hashes against it. The recipes themselves (the Dr. MAS
reference's math, search and wiki-18 sets) live in :mod:`drmas_train.data.recipes`.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from drmas_train.data.recipe import (
    MANIFEST,
    ChecksumError,
    DataPrepError,
    MissingInputError,
    Recipe,
    find_input,
    sha256_file,
)
from drmas_train.data.recipes import RECIPES

__all__ = ["get_recipe", "prepare", "verify", "missing_data_hint"]


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        DataPrepError: unknown name; lists the recipes and suggests the closest.
    """
    if name in RECIPES:
        return RECIPES[name]
    import difflib

    close = difflib.get_close_matches(name, RECIPES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise DataPrepError(f"unknown data recipe {name!r}; recipes: {sorted(RECIPES)}.{hint}")


def _source_counts(path: Path) -> dict[str, int] | None:
    """Rows per ``data_source`` of a task JSONL; None for other files (a corpus, an index)."""
    if not path.name.endswith(".jsonl"):
        return None
    with path.open(encoding="utf-8") as handle:
        first = handle.readline()
        try:
            if "data_source" not in json.loads(first):
                return None
        except (json.JSONDecodeError, TypeError):
            return None
        counts: Counter[str] = Counter([json.loads(first)["data_source"]])
        for line in handle:
            if line.strip():
                counts[json.loads(line)["data_source"]] += 1
    return dict(counts)


def prepare(
    recipe: Recipe | str, raw: str | Path, out: str | Path, *, force: bool = False, progress: bool = False
) -> dict[str, Any]:
    """Build ``recipe``'s files from the raw files under ``raw`` into ``out`` and write ``out/MANIFEST.json``.

    Every input is located (and its pinned SHA-256 checked) before anything is written; outputs are built in a
    temporary directory next to ``out`` and moved in only when all succeeded.

    Args:
        recipe: a :class:`Recipe` or a name in :data:`RECIPES`.
        raw: directory holding the downloaded files (see :attr:`RecipeInput.stem`).
        out: output directory (created).
        force: replace outputs of an earlier run; without it an existing output or manifest is an error.
        progress: progress bars while hashing large files.

    Returns:
        The manifest: ``recipe``, ``reference``, ``created``, ``inputs`` (name -> path, sha256, bytes) and
        ``outputs`` (file -> sha256, bytes, rows, data_sources).

    Raises:
        MissingInputError: raw files are missing (the message names each and how to fetch it).
        ChecksumError: a pinned input hash differs.
        DataPrepError: unknown recipe, malformed rows, or existing outputs without ``force``.
    """
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    raw, out = Path(raw), Path(out)
    paths, missing = {}, []
    for spec in recipe.inputs:  # every missing file is named at once, before anything is read or written
        try:
            paths[spec.name] = find_input(spec, raw)
        except MissingInputError as err:
            missing.append(str(err))
    if missing:
        raise MissingInputError(f"{len(missing)} of {len(recipe.inputs)} input file(s) of {recipe.name!r} missing:\n" + "\n".join(missing))
    existing = [name for name in (*recipe.outputs, MANIFEST) if (out / name).exists()]
    if existing and not force:
        raise DataPrepError(f"{out} already holds {existing}; pass --force to replace them (or choose another --out)")
    inputs = {}
    for spec in recipe.inputs:
        digest = sha256_file(paths[spec.name], progress=progress)
        if spec.sha256 is not None and digest != spec.sha256:
            raise ChecksumError(
                f"input {spec.name!r} at {paths[spec.name]} has SHA-256 {digest}, expected {spec.sha256} "
                f"({spec.origin}); fetch it again with:\n  {spec.fetch.format(raw=raw)}"
            )
        inputs[spec.name] = {"path": str(paths[spec.name]), "origin": spec.origin, "sha256": digest,
                             "bytes": paths[spec.name].stat().st_size, "pinned": spec.sha256 is not None}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".prepare-") as tmp:
        rows = recipe.build(paths, Path(tmp))
        outputs = {}
        for name in recipe.outputs:
            built = Path(tmp) / name
            outputs[name] = {"sha256": sha256_file(built, progress=progress), "bytes": built.stat().st_size, "rows": rows.get(name, 0)}
            sources = _source_counts(built)
            if sources is not None:
                outputs[name]["data_sources"] = sources
        for name in recipe.outputs:
            os.replace(Path(tmp) / name, out / name)
    manifest = {"recipe": recipe.name, "reference": recipe.reference,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "inputs": inputs, "outputs": outputs}  # fmt: skip
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def verify(out: str | Path, *, check_inputs: bool = True) -> list[str]:
    """Re-hash the files recorded in ``out/MANIFEST.json``.

    Args:
        out: a directory written by :func:`prepare`.
        check_inputs: also re-hash the recorded inputs that still exist (missing inputs are not an error: raw
            downloads may have been deleted after preparing).

    Returns:
        One line per problem (a missing or changed output, a changed input); empty when all match.

    Raises:
        DataPrepError: no manifest in ``out``.
    """
    out = Path(out)
    if not (out / MANIFEST).is_file():
        raise DataPrepError(f"{out / MANIFEST} not found: {out} was not written by 'drmas data prepare'")
    manifest = json.loads((out / MANIFEST).read_text())
    problems = []
    for name, rec in manifest["outputs"].items():
        path = out / name
        if not path.is_file():
            problems.append(f"output {path} is missing")
        elif (digest := sha256_file(path)) != rec["sha256"]:
            problems.append(f"output {path} has SHA-256 {digest}, recorded {rec['sha256']}")
    if check_inputs:
        for name, rec in manifest["inputs"].items():
            path = Path(rec["path"])
            if path.is_file() and (digest := sha256_file(path)) != rec["sha256"]:
                problems.append(f"input {name!r} at {path} has SHA-256 {digest}, recorded {rec['sha256']}")
    return problems


def missing_data_hint(path: str | Path) -> str:
    """For a task/corpus path that does not exist: the ``drmas data prepare`` command that writes it, if any."""
    p = Path(path)
    for recipe in RECIPES.values():
        if p.name in recipe.outputs and p.parent.name == recipe.name:
            return f"; it is written by: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    for recipe in RECIPES.values():
        if p.name in recipe.outputs:
            return f"; if it is {recipe.name!r} data: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    return ""
