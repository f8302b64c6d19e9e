"""Procedural tasks from `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_.

A :class:`ReasoningGymSource` is finite and deterministic: reasoning-gym derives entry ``i`` from ``seed + i``,
so ``(dataset, seed, size)`` fixes every task, in every process. Entries are generated lazily on first access
and cached (``gsm_symbolic``: ~5 ms each). reasoning-gym itself (~1.7 s to import) is imported on construction.
"""

from __future__ import annotations

import json
from typing import Any

from drmas_envs.core import Task, TaskSource

__all__ = ["ReasoningGymSource"]


class ReasoningGymSource(TaskSource):
    """``size`` tasks of the reasoning-gym dataset ``dataset`` generated from ``seed``.

    Task fields: ``task_id`` = ``"<dataset>-<seed>-<i>"``, ``data_source`` = ``"reasoning_gym/<dataset>"``,
    ``question``/``answer`` from the entry, ``extra`` = its JSON-serialisable metadata.

    Args:
        dataset: any name ``reasoning_gym.create_dataset`` accepts (``gsm_symbolic``, ``basic_arithmetic``, ...).
        seed: generation seed (int).
        size: number of tasks (> 0).
        **config: extra dataset options passed to ``create_dataset``.

    Raises:
        ValueError: unknown dataset name (message lists close names), non-positive size, options the data set
            does not accept or rejects (message lists its options).
        ImportError: reasoning-gym is not installed.
    """

    def __init__(
        self, dataset: str = "gsm_symbolic", *, seed: int = 0, size: int = 1000, **config: Any
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        try:
            import reasoning_gym
            from reasoning_gym.factory import DATASETS
        except ImportError as err:  # pragma: no cover - a core dependency
            raise ImportError(
                "reasoning-gym is needed for procedural tasks: pip install reasoning-gym"
            ) from err
        if dataset not in DATASETS:
            import difflib

            close = difflib.get_close_matches(dataset, list(DATASETS), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ValueError(
                f"unknown reasoning-gym dataset {dataset!r}.{hint} ({len(DATASETS)} datasets available)"
            )
        self.dataset = dataset
        self.seed = seed
        self.size = size
        self.name = f"reasoning_gym:{dataset}"
        self.config = dict(config)
        try:
            self._data = reasoning_gym.create_dataset(dataset, seed=seed, size=size, **config)
        except (TypeError, AssertionError, ValueError) as err:  # reasoning-gym validates its configs with asserts
            import dataclasses

            fields = [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in ("seed", "size")]
            raise ValueError(
                f"bad options {config!r} for reasoning-gym dataset {dataset!r}: {err or type(err).__name__} "
                f"(its options: {', '.join(fields)})"
            ) from None
        self._cache: dict[int, Task] = {}

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.size))]
        if isinstance(index, bool) or not isinstance(index, int):
            raise TypeError(f"task index must be an int, got {type(index).__name__}")
        if index < 0:
            index += self.size
        if not 0 <= index < self.size:
            raise IndexError(f"task index {index} out of range for {self.size} tasks")
        if index not in self._cache:
            entry = self._data[index]
            metadata = entry.get("metadata", {})
            try:
                extra = json.loads(json.dumps(metadata))
            except (TypeError, ValueError):
                extra = {}
            self._cache[index] = Task(
                f"{self.dataset}-{self.seed}-{index}",
                f"reasoning_gym/{self.dataset}",
                str(entry["question"]),
                str(entry["answer"]),
                extra,
            )
        return self._cache[index]
