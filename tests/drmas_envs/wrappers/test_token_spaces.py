"""TokenSpaces: golden encodings, action decoding, identical spaces, api_test, clear errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import api_test, parallel_api_test

from drmas_envs.wrappers import TokenSpaces, action_vocab_of, encode_ids, to_parallel, vocab_size_of
from helpers.toy_envs import EchoEnv, VerifyLoopEnv


def test_observation_is_padded_token_ids_with_mask(tiny_tokenizer):
    env = TokenSpaces(EchoEnv(), tiny_tokenizer, max_obs_tokens=10, max_act_tokens=3, pad_id=0)
    env.reset(seed=0, options={"task_index": 2})
    # prompt "You are a.\n\nsay 2\nprevious: " -> You are a. say 2 previous:
    obs = env.observe("a")
    assert obs["input_ids"].tolist() == [10, 11, 12, 6, 3, 9, 0, 0, 0, 0]
    assert obs["attention_mask"].tolist() == [1, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    assert obs["input_ids"].dtype == np.int64 and obs["attention_mask"].dtype == np.int8
    assert obs in env.observation_space("a")


@pytest.mark.parametrize(("side", "expected"), [("left", [6, 3, 9]), ("right", [10, 11, 12])])
def test_truncation_side(tiny_tokenizer, side, expected):
    env = TokenSpaces(EchoEnv(), tiny_tokenizer, 3, 3, pad_id=0, truncation_side=side)
    env.reset(seed=0, options={"task_index": 2})
    obs = env.observe("a")
    assert obs["input_ids"].tolist() == expected and obs["attention_mask"].tolist() == [1, 1, 1]


def test_action_is_decoded_up_to_the_first_pad(tiny_tokenizer):
    env = TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4, pad_id=0)
    env.reset(seed=0, options={"task_index": 2})
    env.step(np.array([5, 2, 0, 4]))  # "ok answer:" then stop (the 4 after the pad is dropped)
    assert env.unwrapped.history[-1].text == "ok answer:"
    assert env.unwrapped.history[-1].valid is True
    assert env.decode_action([2, 3]) == "answer: 2"  # shorter lists are accepted
    assert env.encode_action("answer: 4").tolist() == [2, 4, 0, 0]


def test_qwen_round_trip(qwen_tokenizer):
    pad = qwen_tokenizer.token_to_id("<|endoftext|>")
    env = TokenSpaces(VerifyLoopEnv(), qwen_tokenizer, 64, 16, pad_id=pad)
    assert env.vocab_size == qwen_tokenizer.get_vocab_size(with_added_tokens=True) == 151669
    for text in ["answer: 42", "The Verifier says <verify>approve</verify>", "ünïcödé ∑ 数学"]:
        assert env.decode_action(env.encode_action(text)) == text
    env.reset(seed=0)
    ids = env.observe("solver")["input_ids"]
    n = int(env.observe("solver")["attention_mask"].sum())
    assert qwen_tokenizer.decode(ids[:n].tolist()) == env.unwrapped.observe("solver")["prompt"]


def test_identical_spaces_for_every_agent(qwen_tokenizer):
    env = TokenSpaces(VerifyLoopEnv(), qwen_tokenizer, 32, 8, pad_id=0)
    assert env.observation_space("solver") is env.observation_space("verifier")
    assert env.action_space("solver") is env.action_space("verifier")
    act = env.action_space("solver")
    assert isinstance(act, spaces.MultiDiscrete) and act.shape == (8,) and int(act.nvec[0]) == 151669
    obs_space = env.observation_space("solver")
    assert obs_space["input_ids"] == spaces.Box(0, 151668, (32,), np.int64)
    assert obs_space["attention_mask"] == spaces.Box(0, 1, (32,), np.int8)


def test_pettingzoo_checkers_pass(qwen_tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api_test(TokenSpaces(VerifyLoopEnv(), qwen_tokenizer, 48, 6, pad_id=0), num_cycles=200)
        parallel_api_test(
            to_parallel(TokenSpaces(EchoEnv(), qwen_tokenizer, 48, 6, pad_id=0)), num_cycles=200
        )


class _HFStyleTokenizer:
    """Duck-typed Hugging Face tokenizer: encode -> list[int], len(), pad_token_id."""

    pad_token_id = 0

    def __init__(self):
        self.words = ["[PAD]", "x", "y"]

    def __len__(self):
        return len(self.words)

    def encode(self, text):
        return [self.words.index(w) if w in self.words else 1 for w in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_hf_style_tokenizer_is_accepted():
    tok = _HFStyleTokenizer()
    assert vocab_size_of(tok) == 3 and encode_ids(tok, "y x q") == [2, 1, 1]
    env = TokenSpaces(EchoEnv(), tok, 4, 2)  # pad id from tok.pad_token_id
    assert env.pad_id == 0 and env.decode_action([2, 2]) == "y y"


def test_errors_name_the_problem(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"Tokenizer has no pad token id; pass pad_id=\.\.\."):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4)
    with pytest.raises(ValueError, match=r"pad_id must be an int in \[0, 14\), got 14"):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4, pad_id=14)
    with pytest.raises(ValueError, match=r"max_obs_tokens must be an int >= 1, got 0"):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 0, 4, pad_id=0)
    with pytest.raises(ValueError, match=r"truncation_side must be 'left' or 'right', got 'middle'"):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4, pad_id=0, truncation_side="middle")
    with pytest.raises(ValueError, match=r"cannot tell the vocabulary size of object"):
        vocab_size_of(object())
    env = TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4, pad_id=0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"1-D integer array of length 1\.\.4, got shape \(5,\) dtype int64"):
        env.step(np.arange(5))
    with pytest.raises(
        ValueError, match=r"1-D integer array of length 1\.\.4, got shape \(2,\) dtype float64"
    ):
        env.step(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 14\), got min 2 max 99"):
        env.step([2, 99])
    with pytest.raises(ValueError, match=r"text needs 5 tokens but max_act_tokens is 4"):
        env.encode_action("ok ok ok ok ok")
    with pytest.raises(TypeError, match=r"observation has no 'prompt' string .* pass obs_text="):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 4, pad_id=0, obs_text=None).obs_text({"x": 1})


def test_action_vocab_maps_action_values_to_token_ids(tiny_tokenizer):
    # tiny vocabulary: 0 [PAD], 2 "answer:", 3 "2", 4 "4", 5 "ok"
    env = TokenSpaces(VerifyLoopEnv(), tiny_tokenizer, 8, 3, pad_id=0, action_vocab=[2, 3, 4, 0])
    assert env.action_space("solver") == spaces.MultiDiscrete([4, 4, 4])  # 12 logits instead of V * K = 42
    assert env.decode_action([0, 2, 3]) == "answer: 4"  # values index action_vocab; 3 -> pad ends the action
    assert env.decode_action([1, 3, 0]) == "2"
    assert env.encode_action("answer: 2").tolist() == [0, 1, 3]
    assert env.decode_action(env.encode_action("answer: 4")) == "answer: 4"
    env.reset(seed=0, options={"task_index": 2})
    env.step(np.array([0, 2, 3]))
    assert env.unwrapped.history[-1].text == "answer: 4" and env.unwrapped.history[-1].valid is True
    with pytest.raises(ValueError, match=r"action values \(indices into action_vocab\) must be in \[0, 4\), got min 0 max 5"):
        env.decode_action([0, 5])
    with pytest.raises(ValueError, match=r"text 'ok' uses token ids \[5\] that are not in action_vocab"):
        env.encode_action("ok")


def test_action_vocab_qwen_boxed_digits_fit_a_stock_policy(qwen_tokenizer):
    pad = qwen_tokenizer.token_to_id("<|endoftext|>")
    vocab = sorted({*qwen_tokenizer.encode(r"\boxed{0123456789}").ids, pad})
    assert action_vocab_of(qwen_tokenizer, r"\boxed{0123456789}", pad) == vocab and len(vocab) == 15
    env = TokenSpaces(VerifyLoopEnv(), qwen_tokenizer, 64, 16, pad_id=pad, action_vocab=vocab)
    assert int(env.action_space("solver").nvec.sum()) == 16 * len(vocab) <= 256
    for text in [r"\boxed{42}", r"\boxed{7}", "1234"]:
        assert env.decode_action(env.encode_action(text)) == text


@pytest.mark.parametrize(
    ("vocab", "message"),
    [
        ([], r"action_vocab must be a non-empty sequence of ints in \[0, 14\), got \[\]"),
        ([2, 99, 0], r"action_vocab must be a non-empty sequence of ints in \[0, 14\), got \[2, 99, 0\]"),
        ([2, 2, 0], r"action_vocab repeats token ids: \[2\]"),
        ([2, 3], r"action_vocab must contain pad_id 0 \(it ends a token action\)"),
        ("abc", r"action_vocab must be a sequence of token ids, got str"),
    ],
)
def test_action_vocab_errors(tiny_tokenizer, vocab, message):
    with pytest.raises(ValueError, match=message):
        TokenSpaces(EchoEnv(), tiny_tokenizer, 8, 3, pad_id=0, action_vocab=vocab)
