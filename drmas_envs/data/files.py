"""Local JSONL / Parquet task files -> :class:`~drmas_envs.core.ListTaskSource`.

Rows are converted by a :mod:`~drmas_envs.data.row_formats` format, given by name or inferred from the first
row. ``data_source`` is, in order: the ``data_source`` argument, the row's own ``data_source`` field, the file
name without its split suffix (``math500_test.jsonl`` -> ``math500``), the format's default.
Every row error names the file, the 1-based line (JSONL) or row (Parquet) and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from drmas_envs.core import ListTaskSource, Task
from drmas_envs.data.row_formats import DataFormatError, RowFormat, get_format, infer_format

__all__ = ["FILE_SUFFIXES", "read_rows", "load_file", "data_source_from_path", "rows_to_tasks"]

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
_SPLIT_SUFFIX = re.compile(r"[_\-.](train|test|dev|val|validation|eval)([_\-.]?\w*)?$")


def data_source_from_path(path: Path) -> str:
    """``gsm8k_test.jsonl`` -> ``gsm8k``; ``aime24.parquet`` -> ``aime24``."""
    stem = path.name
    for suffix in FILE_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return _SPLIT_SUFFIX.sub("", stem) or stem


def read_rows(path: str | Path) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Yield ``(location, row)`` pairs from a ``.jsonl``, ``.json`` or ``.parquet`` file.

    ``location`` names the file and line (``"data.jsonl:12"``) or row. Blank JSONL lines are skipped; a ``.json``
    file holds either one JSON object per line or one JSON array of objects.

    Raises:
        FileNotFoundError: no such file.
        DataFormatError: a line or element that is not a JSON object, or an unsupported suffix.
        ImportError: Parquet without pyarrow.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, row in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield f"{path}:row {i}", row
        return
    if path.suffix not in (".jsonl", ".json"):
        raise DataFormatError(
            f"{path}: unsupported file type {path.suffix!r}; accepted: {', '.join(FILE_SUFFIXES)}"
        )
    if path.suffix == ".json" and path.read_text(encoding="utf-8").lstrip().startswith("["):
        for i, row in enumerate(json.loads(path.read_text(encoding="utf-8")), start=1):
            if not isinstance(row, dict):
                raise DataFormatError(f"{path}:item {i}: expected a JSON object, got {type(row).__name__}")
            yield f"{path}:item {i}", row
        return
    with path.open(encoding="utf-8") as handle:
        for i, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(
                    f"{path}:{i}: not valid JSON ({err.msg} at column {err.colno})"
                ) from err
            if not isinstance(row, dict):
                raise DataFormatError(
                    f"{path}:{i}: expected a JSON object per line, got {type(row).__name__}"
                )
            yield f"{path}:{i}", row


def rows_to_tasks(
    rows: Iterator[tuple[str, Mapping[str, Any]]],
    *,
    fmt: RowFormat | str | None,
    data_source: str | None,
    fallback_source: str | None,
    limit: int | None = None,
) -> tuple[list[Task], RowFormat | None]:
    """Convert located rows with ``fmt`` (inferred from the first row when ``None``).

    Raises:
        DataFormatError: ``"<file>:<line>: missing field 'answer' (format 'gsm8k' needs question, answer)"``
            and the like for bad values.
    """
    tasks: list[Task] = []
    resolved = get_format(fmt) if isinstance(fmt, str) else fmt
    for index, (where, row) in enumerate(rows):
        if limit is not None and index >= limit:
            break
        if resolved is None:
            resolved = infer_format(row, where)
        missing = [f for f in resolved.required if f not in row]
        if missing:
            raise DataFormatError(
                f"{where}: missing field {missing[0]!r} (format {resolved.name!r} needs {', '.join(resolved.required)})"
            )
        source = (
            data_source
            or row.get("data_source")
            or fallback_source
            or resolved.default_data_source
            or resolved.name
        )
        try:
            tasks.append(resolved.to_task(row, index, str(source)))
        except DataFormatError as err:
            raise DataFormatError(f"{where}: {err}") from err
    return tasks, resolved


def load_file(
    path: str | Path,
    *,
    format: str | None = None,  # noqa: A002 - the natural name for callers
    data_source: str | None = None,
    limit: int | None = None,
) -> ListTaskSource:
    """Load a JSONL/Parquet file of tasks.

    Args:
        path: ``.jsonl`` / ``.json`` (one object per line) or ``.parquet``.
        format: a :mod:`~drmas_envs.data.row_formats` name; inferred from the first row when omitted.
        data_source: tag for every task (default: see the module docstring).
        limit: keep only the first ``limit`` rows.

    Raises:
        FileNotFoundError: no such file. DataFormatError: bad rows, empty file, unknown format.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {str(path)!r} not found")
    tasks, fmt = rows_to_tasks(
        read_rows(path),
        fmt=format,
        data_source=data_source,
        fallback_source=data_source_from_path(path),
        limit=limit,
    )
    if not tasks:
        raise DataFormatError(f"{path}: no rows (an empty task file)")
    return ListTaskSource(tasks, name=f"{fmt.name if fmt else 'tasks'}:{path.name}")
