"""Shared test fixtures. Tests never reach the Hugging Face Hub (HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Retrieval indexes built by any test (search envs appear in envs/, train/ and wrappers/ tests too) go to a
# throw-away directory of this test run, never the user's ~/.cache/drmas, whichever folder is run.
_INDEX_CACHE = tempfile.mkdtemp(prefix="drmas-tests-index-cache-")
os.environ["DRMAS_CACHE_DIR"] = _INDEX_CACHE
_OWNER = os.getpid()  # a forked child exiting must not delete it
atexit.register(lambda: os.getpid() == _OWNER and shutil.rmtree(_INDEX_CACHE, ignore_errors=True))

from shared_data import SHARED_DATA  # noqa: E402  (tests/ is on sys.path: this conftest's folder)


@pytest.fixture
def shared_data() -> Path:
    """The ../shared/data directory (skips when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found: real benchmark data lives in ../shared/data")
    return SHARED_DATA
