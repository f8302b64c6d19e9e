"""Shared test fixtures. Tests never reach the Hugging Face Hub (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: Real benchmark files live beside the repository, in ../shared/data (never copied into the repo).
SHARED_DATA = Path(os.environ.get("DRMAS_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))


def shared_file(name: str) -> Path:
    """Path of ``../shared/data/<name>``; skips the calling test, saying why, when it is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} not found: real benchmark data lives in ../shared/data (set DRMAS_SHARED_DATA to move it)")
    return path


@pytest.fixture
def shared_data() -> Path:
    """The ../shared/data directory (skips when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found: real benchmark data lives in ../shared/data")
    return SHARED_DATA
