"""Leave the global RNGs alone: importing ``drmas_envs`` or making an env must not change ``random``'s or numpy's
global state, whatever a dependency does on import (a first ``make`` of a math env imports reasoning-gym, which
moves ``random``'s state). Users seed those globals for their own code; a library that moves them silently breaks
their reproducibility.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

__all__ = ["global_rng_preserved"]


@contextlib.contextmanager
def global_rng_preserved() -> Iterator[None]:
    """Restore the states of ``random`` and numpy's legacy global generator when the block exits (also on error).

    numpy is only saved and restored when it is already imported (importing it here would be a side effect).
    """
    import sys

    np = sys.modules.get("numpy")
    py_state = random.getstate()
    np_state = np.random.get_state() if np is not None else None
    try:
        yield
    finally:
        random.setstate(py_state)
        np = np or sys.modules.get("numpy")
        if np_state is not None:
            np.random.set_state(np_state)
