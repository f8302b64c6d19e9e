"""Errors of the Ray path, importable without Ray (the single-process trainer catches them too)."""

from __future__ import annotations

__all__ = ["DistributedError"]


class DistributedError(RuntimeError):
    """A worker group failed in a way the run cannot recover from (the message says what died and what to do)."""
