"""Packing sequences into batches under a padded-token budget (shared by the update's micro-batches and the
rollout prefill's length buckets)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["pack_by_token_budget"]


def pack_by_token_budget(
    lengths: Sequence[int],
    token_budget: int,
    *,
    longest_first: bool = False,
    max_pad_fraction: float | None = None,
) -> list[list[int]]:
    """Greedily pack indices, in length order, into consecutive batches whose *padded* size fits the budget.

    A batch of ``k`` sequences costs ``k * max(lengths in it)`` tokens (padding included). Indices are sorted by
    length (stable: ties keep their input order), shortest first or ``longest_first``; the next index joins the
    current batch while the padded size stays within ``token_budget`` and, with ``max_pad_fraction``, while the
    batch's shortest sequence is at most that fraction of its longest shorter than it. Otherwise it starts a new
    batch, so a sequence longer than the budget gets a batch of its own.

    Args:
        lengths: (B,) token count of each sequence.
        token_budget: max padded tokens per batch (>= 1).
        longest_first: sort longest first (batches then hold the longest sequence first).
        max_pad_fraction: None (no padding limit) or in [0, 1): 0 = only equal lengths share a batch.

    Returns:
        lists of indices into ``lengths``; every index appears exactly once, batches in length order.

    Raises:
        ValueError: ``token_budget < 1``.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    order = sorted(range(len(lengths)), key=(lambda i: -lengths[i]) if longest_first else (lambda i: lengths[i]))
    batches: list[list[int]] = []
    longest = shortest = 0
    for i in order:
        if batches:
            grown, low = max(longest, lengths[i]), min(shortest, lengths[i])
            fits = grown * (len(batches[-1]) + 1) <= token_budget
            if fits and (max_pad_fraction is None or grown - low <= max_pad_fraction * grown):
                batches[-1].append(i)
                longest, shortest = grown, low
                continue
        batches.append([i])
        longest = shortest = lengths[i]
    return batches
