"""Shared test fixtures. Tests never reach the Hugging Face Hub (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shared_data import SHARED_DATA  # noqa: E402  (tests/ is on sys.path: this conftest's folder)


@pytest.fixture
def shared_data() -> Path:
    """The ../shared/data directory (skips when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found: real benchmark data lives in ../shared/data")
    return SHARED_DATA
