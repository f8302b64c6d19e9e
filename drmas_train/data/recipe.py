"""A recipe of ``drmas data prepare``: the raw files it reads (:class:`RecipeInput`), how it builds its outputs
(:class:`Recipe`), the errors of data preparation, and the file helpers every recipe uses (SHA-256, locating an input).

The recipes themselves live in :mod:`drmas_train.data.recipes`; running them in :mod:`drmas_train.data.prepare`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "DataPrepError",
    "MissingInputError",
    "ChecksumError",
    "RecipeInput",
    "Recipe",
    "MANIFEST",
    "CHUNK_BYTES",
    "TASK_FILE_SUFFIXES",
    "find_input",
    "sha256_file",
]

#: name of the manifest written next to the prepared files.
MANIFEST = "MANIFEST.json"
#: suffixes of task files (a recipe input is the first of its ``stem + suffix`` that exists).
TASK_FILE_SUFFIXES = (".parquet", ".jsonl", ".json")
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
    suffixes: tuple[str, ...] = TASK_FILE_SUFFIXES
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
