"""Progress of one batched generate call: a bar of generated tokens with a total that becomes exact.

A lock-step call of a few hundred rows can last minutes on a CPU, and under lock-step every episode finishes in
the last steps, so a bar of finished episodes sits at 0 for most of a rollout. :class:`TokenProgress` instead
counts tokens as they are decoded (backends that report them, :func:`drmas_train.backends.base.reports_tokens`):
its total starts at ``rows x max_new_tokens`` (the most the call can produce) and shrinks by a row's unused
allowance as soon as that row finishes, so at the end it equals the tokens generated and the ETA tightens as rows
stop.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TokenProgress"]


class TokenProgress:
    """``on_tokens(rows, tokens)`` callback (the backends' protocol) that drives a tqdm bar of one generate call.

    Args:
        rows: number of output rows of the call (prompts x n). max_new_tokens: each row's token allowance.
        desc: what the bar shows, e.g. ``"validation · step 2 · shared · 128 calls"``.
        disable: no bar (the callback still counts).

    Rows are assumed to receive a token at every decode step from their first token until they finish (the HF
    engine's contract: a finished row leaves the decode batch and never comes back); a row that stops appearing
    has finished.
    """

    def __init__(self, rows: int, max_new_tokens: int, *, desc: str, disable: bool = False) -> None:
        from tqdm.auto import tqdm

        self.max_new_tokens = max_new_tokens
        self.produced: dict[int, int] = {}  # row -> tokens so far
        self._live: set[int] = set()
        self.bar = tqdm(total=rows * max_new_tokens, desc=desc, unit="tok", leave=False, disable=disable,
                        dynamic_ncols=True)  # fmt: skip

    def __call__(self, rows: list[int], tokens: list[Any]) -> None:
        now = set(rows)
        finished = self._live - now
        if finished:  # their unused allowance will never come: the total tightens
            self.bar.total -= sum(self.max_new_tokens - self.produced[r] for r in finished)
        self._live = now
        for r in rows:
            self.produced[r] = self.produced.get(r, 0) + 1
        self.bar.update(len(tokens))

    def close(self) -> None:
        """End the call: every row has finished, so the total is the tokens generated."""
        self.bar.total = sum(self.produced.values())
        self.bar.refresh()
        self.bar.close()

    def __enter__(self) -> TokenProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
