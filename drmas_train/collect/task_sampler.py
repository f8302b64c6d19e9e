"""Which tasks each iteration trains on: epoch-wise shuffled draws without replacement, resumable."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["TaskSampler"]


class TaskSampler:
    """Draw ``batch_size`` task indices per iteration from ``range(n_tasks)``.

    Each epoch is a fresh permutation from ``numpy.random.default_rng([seed, epoch])``; a batch that crosses an
    epoch boundary continues into the next permutation. The whole state is ``(epoch, cursor)``, saved in
    checkpoints, so a resumed run draws exactly the tasks the uninterrupted run would have.

    Raises:
        ValueError: ``n_tasks < 1`` or ``batch_size < 1``.
    """

    def __init__(self, n_tasks: int, batch_size: int, seed: int = 0) -> None:
        if n_tasks < 1 or batch_size < 1:
            raise ValueError(f"need n_tasks >= 1 and batch_size >= 1, got {n_tasks}, {batch_size}")
        self.n_tasks, self.batch_size, self.seed = int(n_tasks), int(batch_size), int(seed)
        self.epoch, self.cursor = 0, 0

    def _perm(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n_tasks)

    def next_batch(self) -> list[int]:
        """The next ``batch_size`` task indices (ints in ``[0, n_tasks)``)."""
        out: list[int] = []
        perm = self._perm()
        while len(out) < self.batch_size:
            if self.cursor == self.n_tasks:
                self.epoch, self.cursor = self.epoch + 1, 0
                perm = self._perm()
            take = min(self.batch_size - len(out), self.n_tasks - self.cursor)
            out.extend(int(i) for i in perm[self.cursor : self.cursor + take])
            self.cursor += take
        return out

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "cursor", "n_tasks", "seed"}``."""
        return {"epoch": self.epoch, "cursor": self.cursor, "n_tasks": self.n_tasks, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`.

        Raises:
            ValueError: the saved task count differs (the data changed since the checkpoint).
        """
        if int(state["n_tasks"]) != self.n_tasks:
            raise ValueError(f"checkpoint was made with {state['n_tasks']} tasks, this run has {self.n_tasks}")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
