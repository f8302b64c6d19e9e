"""Batched prefill (dedup, shared prefix, length buckets, stitching), early row exit and the fast sampler."""

from __future__ import annotations

import pytest
import torch

from drmas_train.backends.base import SamplingParams
from drmas_train.backends.hf import HFBackend, next_tokens, sample_weights
from drmas_train.model.logprobs import cache_kwarg
from drmas_train.model.prefill import Segment, can_stitch, length_buckets, prefill, prompt_tree
from helpers.backend_fakes import max_logprob_error, tiny

SYSTEM = (
    "You are the Solver of a two-agent team. Reason step by step, show every intermediate result, "
    "and put the final answer in \\boxed{}. The Verifier will check your work and may send it back."
)
QUESTIONS = [
    "What is 2 + 3?",
    "A shop sells 17 pens a day for 3 days and then 4 more pens. How many pens were sold in total?",
    "Compute 12 * 12.",
    "What is 2 + 3?",  # a duplicate, as the G rollouts of one task are
    "If x + 4 = 10, what is x? Give the answer as an integer.",
]
PROMPTS = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}] for q in QUESTIONS]
# a later turn of two rollout groups: system + question shared in a group, then each rollout's own history
LATER_TURN = [
    [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": q},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "The Verifier rejected this. Try again."},
    ]
    for q in QUESTIONS[1:3]
    for answer in ("17 * 3 = 51, plus 4 is 55. \\boxed{55}", "51 + 4 = 56 \\boxed{56}", "I am not sure.")
]


# ---- pure helpers ----
def test_prompt_tree_golden():
    # [1 2 3] is shared by three prompts (>= 2 tokens: one segment); [4] by two (< 2: recomputed in each leaf)
    assert prompt_tree([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7], [9, 9]], min_shared=2) == [
        Segment(prompt=0, start=0, end=3, parent=-1, depth=0),
        Segment(prompt=2, start=3, end=4, parent=0, depth=1, leaf=2),
        Segment(prompt=0, start=3, end=5, parent=0, depth=1, leaf=0),
        Segment(prompt=1, start=3, end=5, parent=0, depth=1, leaf=1),
        Segment(prompt=3, start=0, end=2, parent=-1, depth=0, leaf=3),
    ]
    # a prompt that is a prefix of another still ends in a leaf of its own (its last token is recomputed)
    assert prompt_tree([[1, 2, 3], [1, 2, 3, 4]], min_shared=1) == [
        Segment(prompt=0, start=0, end=2, parent=-1, depth=0),
        Segment(prompt=0, start=2, end=3, parent=0, depth=1, leaf=0),
        Segment(prompt=1, start=2, end=4, parent=0, depth=1, leaf=1),
    ]


def test_prompt_tree_handles_deep_nesting_and_rejects_bad_min_shared():
    nested = [[7] * k for k in range(1, 1201)]  # 1,200 prompts, each a prefix of the next
    segments = prompt_tree(nested, min_shared=32)
    assert sorted(seg.leaf for seg in segments if seg.leaf >= 0) == list(range(1200))
    with pytest.raises(ValueError, match="min_shared must be >= 1, got 0"):
        prompt_tree([[1, 2], [3, 4]], min_shared=0)


def test_prefill_rejects_empty_input():
    loaded = tiny("tiny-llama")
    for rows in ([], [[], [1, 2]]):
        with pytest.raises(ValueError, match="no empty row"):
            prefill(loaded.model, cache_kwarg(loaded.model), rows, pad_token_id=0, device="cpu")


def _tree_tokens(prompts, segments, i):
    seg = segments[i]
    own = prompts[seg.prompt][seg.start : seg.end]
    return (_tree_tokens(prompts, segments, seg.parent) if seg.parent >= 0 else []) + own


def test_prompt_tree_rebuilds_every_prompt_and_shares_long_runs():
    g = torch.Generator().manual_seed(0)
    system = torch.randint(0, 50, (40,), generator=g).tolist()
    prompts = []
    for _task in range(6):  # 6 tasks x up to 4 distinct continuations, as in a later turn of a rollout group
        question = torch.randint(0, 50, (int(torch.randint(5, 30, (1,), generator=g)),), generator=g).tolist()
        for _ in range(4):
            tail = torch.randint(0, 50, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
            prompts.append(system + question + tail)
    prompts = [list(p) for p in dict.fromkeys(map(tuple, prompts))]
    segments = prompt_tree(prompts, min_shared=8)
    leaves = sorted(seg.leaf for seg in segments if seg.leaf >= 0)
    assert leaves == list(range(len(prompts)))
    for i, seg in enumerate(segments):
        assert seg.parent < i and seg.end > seg.start
        assert seg.depth == (segments[seg.parent].depth + 1 if seg.parent >= 0 else 0)
        if seg.leaf >= 0:
            assert _tree_tokens(prompts, segments, i) == prompts[seg.leaf]
        else:
            assert seg.end - seg.start >= 8
    computed = sum(seg.end - seg.start for seg in segments)
    assert computed <= sum(map(len, prompts)) - 40 * (len(prompts) - 1)  # the system prompt once at most


def test_length_buckets_golden_and_properties():
    # longest first; 10 and 9 share (9 is 10% shorter), 6 does not (40%); the budget 20 stops a third 10-token row
    assert length_buckets([6, 10, 9, 10, 10], token_budget=20, max_pad_fraction=0.125) == [
        [1, 3],
        [4, 2],
        [0],
    ]
    assert length_buckets([5, 5, 5], token_budget=100, max_pad_fraction=0.0) == [[0, 1, 2]]
    assert length_buckets([50, 3], token_budget=10, max_pad_fraction=0.9) == [[0], [1]]  # over budget: alone
    lengths = [int(x) for x in torch.randint(1, 300, (200,), generator=torch.Generator().manual_seed(0))]
    buckets = length_buckets(lengths, token_budget=1024, max_pad_fraction=0.2)
    assert sorted(i for b in buckets for i in b) == list(range(200))
    for b in buckets:
        longest = lengths[b[0]]
        assert all(lengths[i] <= longest and longest - lengths[i] <= 0.2 * longest for i in b)
        assert len(b) == 1 or len(b) * longest <= 1024
    with pytest.raises(ValueError, match="token_budget must be >= 1"):
        length_buckets([1], token_budget=0, max_pad_fraction=0.1)
    with pytest.raises(ValueError, match=r"max_pad_fraction must be in \[0, 1\)"):
        length_buckets([1], token_budget=8, max_pad_fraction=1.0)


@pytest.mark.slow
def test_sample_weights_frequencies_across_blocks_and_zero_weights():
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor(
        [0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.2, 0.4]
    )  # blocks of 4: 0.1, 0, 0.5, 0.4
    draws = sample_weights((probs * 7).repeat(40_000, 1), g, block=4)  # unnormalised weights
    freq = torch.bincount(draws, minlength=11) / 40_000
    assert freq[probs == 0].sum() == 0  # zero weights (and the all-zero block) are never drawn
    assert torch.allclose(freq, probs, atol=0.01)  # 4+ sigma at n = 40k
    for index in (0, 5000, 151668):  # one positive weight, subnormal: rounding must not pick a zero weight
        tiny_weight = torch.zeros((2000, 151669))
        tiny_weight[:, index] = 1e-44
        assert sample_weights(tiny_weight, g).unique().tolist() == [index]
    one_hot = torch.zeros((3, 2500))
    one_hot[[0, 1, 2], [2499, 0, 1024]] = 1.0  # last token of a partial block, first token, a block start
    assert sample_weights(one_hot, g).tolist() == [2499, 0, 1024]


@pytest.mark.parametrize(
    "sampling",
    [SamplingParams(temperature=0.7), SamplingParams(temperature=0), SamplingParams(top_k=5, top_p=0.8)],
    ids=["t0.7", "greedy", "topk-topp"],
)
def test_next_tokens_logprob_is_the_unfiltered_log_softmax(sampling):
    logits = torch.randn((6, 3000), generator=torch.Generator().manual_seed(1)) * 4
    tokens, lp = next_tokens(logits.clone(), sampling, torch.Generator().manual_seed(2))
    temperature = sampling.temperature or 1.0
    want = torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(lp, want, atol=1e-5, rtol=0)
    if sampling.temperature == 0:
        assert tokens.tolist() == logits.argmax(-1).tolist()
    if sampling.top_k == 5:
        top5 = logits.topk(5, dim=-1).indices
        assert all(t in row for t, row in zip(tokens.tolist(), top5.tolist(), strict=True))


# ---- prefill against plain forwards ----
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("stitch", [True, False], ids=["stitched", "padded"])
def test_prefill_matches_an_unpadded_forward_of_each_prompt(name, stitch):
    loaded = tiny(name)
    backend = HFBackend.from_loaded(loaded)
    rows = backend.encode_prompts(PROMPTS)
    state = _check_prefill(loaded, backend, rows, stitch=stitch, min_shared_prefix=32)
    if stitch:
        # the system prompt once, then the 4 distinct questions: 2 forwards at least, fewer tokens than 5 prompts
        distinct = [list(r) for r in dict.fromkeys(map(tuple, rows))]
        needed = sum(seg.end - seg.start for seg in prompt_tree(distinct, 32))
        assert needed < sum(map(len, distinct)) - 32 * 3
        assert state.forwards >= 2
        assert needed <= state.prefill_tokens <= 2 * needed  # only bucket padding on top


@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
def test_prefill_of_a_three_level_tree_matches_unpadded_forwards(name):
    loaded = tiny(name)
    backend = HFBackend.from_loaded(loaded)
    rows = backend.encode_prompts(LATER_TURN)
    distinct = [list(r) for r in dict.fromkeys(map(tuple, rows))]
    assert max(seg.depth for seg in prompt_tree(distinct, 4)) == 2  # system | question | own history
    state = _check_prefill(loaded, backend, rows, stitch=True, min_shared_prefix=4)
    assert state.prefill_tokens < sum(map(len, rows)) / 2


def _check_prefill(loaded, backend, rows, **kwargs):
    """Prefill ``rows`` and compare every row's mask, next position and logits with an unpadded forward."""
    state = prefill(
        loaded.model,
        cache_kwarg(loaded.model),
        rows,
        pad_token_id=backend.pad_token_id,
        device="cpu",
        token_budget=2 * max(map(len, rows)),
        **kwargs,
    )
    width = max(map(len, rows))
    assert state.attention_mask.shape == (len(rows), width)
    assert state.attention_mask.sum(-1).tolist() == [len(r) for r in rows]
    assert state.next_positions.squeeze(-1).tolist() == [len(r) for r in rows]
    for b, r in enumerate(rows):
        with torch.no_grad():
            want = loaded.model(input_ids=torch.tensor([r])).logits[0, -1]
        assert torch.allclose(state.logits[b], want, atol=1e-4, rtol=0)
    return state


def test_can_stitch_is_true_for_the_tiny_models():
    assert can_stitch(tiny("tiny-qwen3").model) and can_stitch(tiny("tiny-llama").model)


# ---- generation: batching never changes a row ----
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("stitch", [True, False], ids=["stitched", "padded"])
def test_greedy_batch_equals_each_prompt_alone(name, stitch):
    backend = HFBackend.from_loaded(tiny(name))
    backend._stitch = stitch
    greedy = SamplingParams(temperature=0.0, max_new_tokens=6)
    alone = [backend.generate([p], greedy)[0] for p in PROMPTS]
    batched = backend.generate(PROMPTS, greedy)
    assert [g.response_ids for g in batched] == [g.response_ids for g in alone]
    for b, a in zip(batched, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(b.logprobs, a.logprobs, strict=True)) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("stitch", [True, False], ids=["stitched", "padded"])
def test_rows_leaving_the_batch_early_keep_the_others_exact(name, stitch):
    """Rows end at different steps and leave the decode batch; every later token's log-prob must still equal a
    fresh forward pass of that row alone (a wrong row kept in the cache would break it)."""
    loaded = tiny(name)
    backend = HFBackend.from_loaded(loaded)
    backend._stitch = stitch
    backend.eos_token_ids = frozenset(range(len(loaded.tokenizer) // 6))  # ~1 in 6 draws ends a row
    gens = backend.generate(PROMPTS + LATER_TURN, SamplingParams(max_new_tokens=12, n=3, seed=7))
    lengths = sorted(len(g.response_ids) for g in gens)
    assert lengths[0] < lengths[-1] and lengths[-1] > 2, lengths
    assert max_logprob_error(loaded, gens, pad_token_id=backend.pad_token_id) < 1e-4
