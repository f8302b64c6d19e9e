"""One token-budget packer serves the update's micro-batches and the prefill's length buckets."""

from __future__ import annotations

import random

import pytest

from drmas_train.algorithm.optim import micro_batches
from drmas_train.model.prefill import length_buckets
from drmas_train.model.token_budget import pack_by_token_budget


def _old_micro_batches(lengths, token_budget):  # optim.micro_batches before it used the shared packer
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    out, current, longest = [], [], 0
    for i in order:
        grown = max(longest, lengths[i])
        if current and grown * (len(current) + 1) > token_budget:
            out.append(current)
            current, grown = [], lengths[i]
        current.append(i)
        longest = grown
    return out + ([current] if current else [])


def _old_length_buckets(lengths, token_budget, max_pad_fraction):  # prefill.length_buckets before
    buckets = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if buckets:
            bucket = buckets[-1]
            longest = lengths[bucket[0]]
            if (len(bucket) + 1) * longest <= token_budget and longest - lengths[i] <= max_pad_fraction * longest:
                bucket.append(i)
                continue
        buckets.append([i])
    return buckets


def test_golden_packing():
    assert pack_by_token_budget([5, 1, 3, 3], 9) == [[1, 2, 3], [0]]  # 3 x 3 = 9 fits; 4 x 5 does not
    assert pack_by_token_budget([5, 1, 3, 3], 9, longest_first=True) == [[0], [2, 3, 1]]
    assert pack_by_token_budget([10, 9, 6], 30, longest_first=True, max_pad_fraction=0.1) == [[0, 1], [2]]
    with pytest.raises(ValueError, match="token_budget must be >= 1, got 0"):
        pack_by_token_budget([1], 0)


@pytest.mark.parametrize("seed", range(20))
def test_both_call_sites_match_their_previous_implementations(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(rng.randint(0, 30))]
    budget, frac = rng.randint(1, 200), rng.choice([0.0, 0.1, 0.25, 0.5, 0.9])
    assert micro_batches(lengths, budget) == _old_micro_batches(lengths, budget)
    assert length_buckets(lengths, token_budget=budget, max_pad_fraction=frac) == _old_length_buckets(lengths, budget, frac)
