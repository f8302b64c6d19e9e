"""Ctrl-C during training: stop at a point where the run can be saved exactly, then save and say where.

The trainer runs each iteration's model update (and what follows it up to the checkpoint) inside
:func:`deferred_sigint`: a first SIGINT there is noted and re-raised as :class:`KeyboardInterrupt` only when the
block ends, so the weights are never saved half-updated; a second SIGINT aborts at once (no checkpoint).
Outside the block (rollout) ``KeyboardInterrupt`` is raised immediately as usual, and the trainer saves the
weights of the last completed iteration.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["deferred_sigint"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def deferred_sigint(what: str = "the update") -> Iterator[None]:
    """Hold off SIGINT while the block runs; re-raise it as :class:`KeyboardInterrupt` when the block ends.

    A no-op outside the main thread (only the main thread receives signals) or when SIGINT is not handled by
    Python's default handler (e.g. ignored by the parent).

    Raises:
        KeyboardInterrupt: at the end of the block if SIGINT arrived during it, or at once on a second SIGINT.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if received:
            raise KeyboardInterrupt
        received.append(signum)
        logger.warning("Ctrl-C: finishing %s, then saving a checkpoint (Ctrl-C again to abort without saving)", what)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt
