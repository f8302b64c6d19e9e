"""One entry point for every task source: :func:`load_tasks`.

Accepted ``spec`` forms:

========================================  ==========================================================
``TaskSource`` (e.g. ``ListTaskSource``)   returned unchanged
``"reasoning_gym:<dataset>"``              :class:`~drmas_envs.data.procedural.ReasoningGymSource`
                                           (``seed``, ``size``, ``options`` keywords; ``reasoning-gym:`` also works)
``"/path/file.jsonl"`` / ``.parquet``      :func:`~drmas_envs.data.files.load_file` (``format``, ``data_source``,
                                           ``limit``); a ``pathlib.Path`` too
``"hf:<id>[:<config>][@<split>]"``         :func:`~drmas_envs.data.hf.load_hf` (split defaults to ``test``)
========================================  ==========================================================
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drmas_envs.core import TaskSource
from drmas_envs.data.files import FILE_SUFFIXES, load_file
from drmas_envs.data.hf import load_hf
from drmas_envs.data.procedural import ReasoningGymSource

__all__ = ["load_tasks", "DEFAULT_MATH_SPEC"]

#: The math envs' default: 1,000 reasoning-gym gsm_symbolic problems from seed 0 (offline, deterministic).
DEFAULT_MATH_SPEC = "reasoning_gym:gsm_symbolic"

_PROCEDURAL = ("reasoning_gym:", "reasoning-gym:")


def load_tasks(
    spec: str | Path | TaskSource,
    *,
    format: str | None = None,  # noqa: A002
    data_source: str | None = None,
    limit: int | None = None,
    seed: int = 0,
    size: int = 1000,
    options: Mapping[str, Any] | None = None,
) -> TaskSource:
    """Build a task source from ``spec`` (see the module docstring for the accepted forms).

    Args:
        spec: a TaskSource, a ``reasoning_gym:``/``hf:`` spec, or a file path.
        format, data_source, limit: for files and HF ids (see :func:`~drmas_envs.data.files.load_file`).
        seed, size: for reasoning-gym sources.
        options: for reasoning-gym sources: the data set's own options (``reasoning_gym.create_dataset`` keywords,
            e.g. ``{"max_digits": 2}`` for ``basic_arithmetic``); ignored by files and HF ids (which have none).

    Raises:
        ValueError: a string that is none of the accepted forms (the message lists them).
        FileNotFoundError: a path-like spec whose file does not exist.
        DataFormatError / HFUnavailableError: from the loaders.
    """
    if isinstance(spec, TaskSource):
        return spec
    if isinstance(spec, Path):
        return load_file(spec, format=format, data_source=data_source, limit=limit)
    if not isinstance(spec, str):
        raise TypeError(f"task spec must be a str, a pathlib.Path or a TaskSource, got {type(spec).__name__}")
    for prefix in _PROCEDURAL:
        if spec.startswith(prefix):
            dataset = spec[len(prefix) :] or "gsm_symbolic"
            if options:
                return ReasoningGymSource(dataset, seed=seed, size=size, **dict(options))
            if type(seed) is int and type(size) is int:  # noqa: E721 - bools and odd types get the checks
                return _reasoning_gym(dataset, seed, size)
            return ReasoningGymSource(dataset, seed=seed, size=size)
    if spec.startswith("hf:"):
        rest, _, split = spec[3:].partition("@")
        parts = rest.split(":")
        if not parts[0] or len(parts) > 2:
            raise ValueError(f"malformed Hugging Face spec {spec!r}: expected 'hf:<id>[:<config>][@<split>]'")
        return load_hf(
            parts[0],
            config=parts[1] if len(parts) == 2 else None,
            split=split or "test",
            format=format,
            data_source=data_source,
            limit=limit,
        )
    if spec.endswith(FILE_SUFFIXES) or "/" in spec or Path(spec).exists():
        return load_file(spec, format=format, data_source=data_source, limit=limit)
    raise ValueError(
        f"cannot read task spec {spec!r}: expected a file path ({', '.join(FILE_SUFFIXES)}), "
        "'reasoning_gym:<dataset>' (e.g. 'reasoning_gym:gsm_symbolic'), 'hf:<id>[:<config>][@<split>]', "
        "or a TaskSource"
    )


@functools.lru_cache(maxsize=32)
def _reasoning_gym(dataset: str, seed: int, size: int) -> ReasoningGymSource:
    """One shared source per (dataset, seed, size): every env of a rollout batch builds its default tasks, and
    generating them again per env instance cost ~0.7 ms each (its tasks are immutable, so sharing is safe)."""
    return ReasoningGymSource(dataset, seed=seed, size=size)
