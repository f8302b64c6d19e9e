"""Machinery of ``drmas data prepare``: recipes of raw files -> prepared files, checksums and the manifest.

A :class:`Recipe` names the raw files it reads (:class:`RecipeInput`: where each comes from and the command that
fetches it) and a ``build`` function; :func:`prepare` locates every input (naming each missing one at once), checks
pinned hashes, builds into a temporary directory, moves the outputs in and writes ``MANIFEST.json`` (SHA-256, size
and rows of every input and output); :func:`verify` re-hashes against it. The recipes themselves (the Dr. MAS
reference's math, search and wiki-18 sets) live in :mod:`drmas_train.run.data_recipes`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "DataPrepError",
    "MissingInputError",
    "ChecksumError",
    "RecipeInput",
    "Recipe",
    "MANIFEST",
    "CHUNK_BYTES",
    "get_recipe",
    "find_input",
    "prepare",
    "verify",
    "sha256_file",
    "missing_data_hint",
    "require_task_files",
]

#: name of the manifest written next to the prepared files.
MANIFEST = "MANIFEST.json"
_SUFFIXES = (".parquet", ".jsonl", ".json")
#: read/copy size for large files (1 MiB).
CHUNK_BYTES = 1 << 20


class DataPrepError(ValueError):
    """A recipe cannot run: unknown recipe, malformed rows, an existing output, ... (the message says what to do)."""


class MissingInputError(DataPrepError):
    """A raw input file is missing; the message names the file and the command that fetches it."""


class ChecksumError(DataPrepError):
    """A file's SHA-256 differs from the pinned or recorded one."""


@dataclasses.dataclass(frozen=True)
class RecipeInput:
    """One raw file a recipe reads.

    Attributes:
        name: short name (``"aime24"``), also the ``data_source`` tag of its tasks unless the rows carry their own.
        stem: path under the raw directory without suffix (``"aime24"``, ``"nq_hotpotqa_train/test"``); the first
            of ``stem + s`` for s in ``suffixes`` that exists is read.
        origin: where the file comes from (dataset id and split), for messages and the manifest.
        fetch: a shell command that writes the file; ``{raw}`` stands for the raw directory.
        suffixes: accepted file suffixes, in order of preference.
        sha256: the expected SHA-256 when the source pins it (None: recorded, not checked).
    """

    name: str
    stem: str
    origin: str
    fetch: str
    suffixes: tuple[str, ...] = _SUFFIXES
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A data set of the reference, rebuilt from raw files.

    Attributes:
        name: recipe name (``drmas data prepare <name>``).
        description: one line.
        reference: the reference file it reproduces.
        inputs: the raw files.
        build: ``(input paths by name, out dir) -> {output file name: row count}``; writes the outputs into the
            (temporary) out dir and raises :class:`DataPrepError` for bad rows.
        outputs: the file names ``build`` writes.
        next_steps: printed after a successful run (``{out}`` = the output directory).
    """

    name: str
    description: str
    reference: str
    inputs: tuple[RecipeInput, ...]
    build: Callable[[dict[str, Path], Path], dict[str, int]]
    outputs: tuple[str, ...]
    next_steps: str = ""


def sha256_file(path: str | Path, *, progress: bool = False) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks (works for multi-GB indexes).

    Args:
        progress: show a tqdm bar (in bytes) for files over 64 MiB.
    """
    from tqdm.auto import tqdm

    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with path.open("rb") as handle, tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}",
                                         disable=not progress or size < 64 * CHUNK_BYTES) as bar:  # fmt: skip
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def find_input(spec: RecipeInput, raw: Path) -> Path:
    """The file of ``spec`` under ``raw``.

    Raises:
        MissingInputError: none of the accepted names exists; names the expected path and the fetch command.
    """
    for suffix in spec.suffixes:
        path = raw / f"{spec.stem}{suffix}"
        if path.is_file():
            return path
    names = " or ".join(f"{spec.stem}{s}" for s in spec.suffixes)
    raise MissingInputError(
        f"missing input {spec.name!r}: expected {raw / names} ({spec.origin}). Fetch it with:\n"
        f"  {spec.fetch.format(raw=raw)}"
    )


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``.

    Raises:
        DataPrepError: unknown name; lists the recipes and suggests the closest.
    """
    from drmas_train.run.data_recipes import RECIPES

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
    from drmas_train.run.data_recipes import RECIPES

    p = Path(path)
    for recipe in RECIPES.values():
        if p.name in recipe.outputs and p.parent.name == recipe.name:
            return f"; it is written by: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    for recipe in RECIPES.values():
        if p.name in recipe.outputs:
            return f"; if it is {recipe.name!r} data: drmas data prepare {recipe.name} --out {p.parent} (see: drmas data list)"
    return ""


def require_task_files(cfg: Any) -> None:
    """Check that the task files a :class:`~drmas_train.run.config.TrainConfig` names exist (``env.data``,
    ``env.kwargs.tasks``, and ``eval.data`` when evaluating), before anything loads.

    Raises:
        drmas_train.run.config.ConfigError: naming the key, the path and, for a recipe's output, the
            ``drmas data prepare`` command that writes it.
    """
    from drmas_train.run.config import ConfigError

    keys = (("env.data", cfg.env.data), ("env.kwargs.tasks", cfg.env.kwargs.get("tasks")),
            ("eval.data", cfg.eval.data if cfg.eval.every > 0 else None))  # fmt: skip
    for key, spec in keys:
        if isinstance(spec, str) and spec.endswith(_SUFFIXES) and not Path(spec).is_file():
            from drmas_train.run.env_setup import DATA_FORMS

            hint = missing_data_hint(spec)  # a recipe's output: the command that writes it; else the accepted forms
            raise ConfigError(f"{key}={spec!r}: task file {spec!r} not found" + (hint or f". Accepted: {DATA_FORMS}"))
