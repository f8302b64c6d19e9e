"""The :class:`Task` record: one problem an episode is played on."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Task", "TaskSource", "ListTaskSource"]


@dataclasses.dataclass(frozen=True)
class Task:
    """One problem, independent of any env.

    Attributes:
        task_id: stable id, unique within its ``data_source`` (e.g. ``"gsm8k-test-17"``).
        data_source: benchmark tag used for per-source metrics (``"gsm8k"``, ``"math500"``, ``"hotpotqa"``,
            ``"nq"``, ``"reasoning_gym/gsm_symbolic"``, ...). Search tags follow Search-R1.
        question: the problem text shown to the agents.
        answer: the ground truth: one string, or several acceptable strings (QA ``golden_answers``).
        extra: anything else the source carries (solution, level, supporting facts, ...); JSON-serialisable.
    """

    task_id: str
    data_source: str
    question: str
    answer: str | tuple[str, ...]
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for field in ("task_id", "data_source", "question"):
            if not isinstance(getattr(self, field), str):
                raise TypeError(f"Task.{field} must be a str, got {type(getattr(self, field)).__name__}")
        if isinstance(self.answer, list):
            object.__setattr__(self, "answer", tuple(self.answer))
        if not isinstance(self.answer, (str, tuple)) or (
            isinstance(self.answer, tuple) and not all(isinstance(a, str) for a in self.answer)
        ):
            raise TypeError(f"Task.answer must be a str or a sequence of str, got {self.answer!r}")

    @property
    def answers(self) -> tuple[str, ...]:
        """The ground truth as a tuple of acceptable strings."""
        return (self.answer,) if isinstance(self.answer, str) else self.answer

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; :meth:`from_dict` is its inverse."""
        return {
            "task_id": self.task_id,
            "data_source": self.data_source,
            "question": self.question,
            "answer": self.answer if isinstance(self.answer, str) else list(self.answer),
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Task:
        """Build from :meth:`to_dict` output."""
        return cls(row["task_id"], row["data_source"], row["question"], row["answer"], dict(row.get("extra", {})))


class TaskSource(Sequence[Task]):
    """An indexable, finite collection of tasks (``len`` and ``[i]``), the unit envs draw from.

    Procedural sources are finite too: they are generated from a seed with a fixed size, so
    ``options={"task_index": i}`` always names one task.
    """

    name: str = "tasks"


class ListTaskSource(TaskSource):
    """A :class:`TaskSource` over an in-memory list of tasks.

    Raises:
        ValueError: if ``tasks`` is empty.
    """

    def __init__(self, tasks: Sequence[Task], name: str = "tasks") -> None:
        self._tasks = list(tasks)
        if not self._tasks:
            raise ValueError(f"task source {name!r} is empty: give at least one Task")
        self.name = name

    def __len__(self) -> int:
        return len(self._tasks)

    def __getitem__(self, index):  # type: ignore[override]
        return self._tasks[index]
