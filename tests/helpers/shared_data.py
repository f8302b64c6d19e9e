"""Where the real benchmark files live: ../shared/data beside the repository (never copied into it).

Test modules import from here (``from helpers.shared_data import shared_file``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Real benchmark files live beside the repository, in ../shared/data (never copied into the repo).
SHARED_DATA = Path(os.environ.get("DRMAS_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def shared_file(name: str) -> Path:
    """Path of ``../shared/data/<name>``; skips the calling test, saying why, when it is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not found: real benchmark data lives in ../shared/data (set DRMAS_SHARED_DATA to move it)")
    return path
