"""Test helpers for backends and rollout: a scripted backend and cached tiny models."""

from __future__ import annotations

import functools

from drmas_train.backends.base import Generation, SamplingParams
from drmas_train.model.models import LoadedModel, ModelSpec, load_model


@functools.lru_cache(maxsize=8)
def tiny(name: str = "tiny-qwen3", seed: int = 0) -> LoadedModel:
    """A cached tiny model (callers must not change its weights)."""
    import torch

    torch.set_num_threads(1)
    return load_model(ModelSpec(name, seed=seed))


def max_logprob_error(loaded: LoadedModel, gens, temperature: float = 1.0, pad_token_id=None) -> float:
    """Largest |generation log-prob - fresh forward-pass log-prob| over all tokens of ``gens`` (float32)."""
    import torch

    from drmas_train.model.logprobs import forward_logprobs

    with torch.no_grad():
        lp, mask, _ = forward_logprobs(
            loaded.model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            pad_token_id=loaded.tokenizer.pad_token_id if pad_token_id is None else pad_token_id,
            temperature=temperature,
        )
    assert [int(m.sum()) for m in mask] == [len(g.response_ids) for g in gens]
    return max(
        (lp[i, : len(g.logprobs)] - torch.tensor(g.logprobs)).abs().max().item() for i, g in enumerate(gens)
    )


class ScriptedBackend:
    """Answers every prompt with ``reply(messages, call_index, row)``; records each batched call's size.

    Token ids are fake but consistent: the prompt id list has one id per message, the response one id per word.
    """

    tokenizer = None

    def __init__(self, reply=None):
        self.reply = reply or (lambda messages, call, row: "ok")
        self.calls: list[int] = []
        self.prompts: list[list] = []

    def generate(self, prompts, sampling: SamplingParams, **kwargs):
        call = len(self.calls)
        self.calls.append(len(prompts))
        self.prompts.append([list(p) for p in prompts])
        out = []
        for row, messages in enumerate(prompts):
            for _ in range(sampling.n):
                text = self.reply(messages, call, row)
                words = text.split() or [""]
                out.append(
                    Generation(
                        text=text,
                        prompt_ids=list(range(len(messages))),
                        response_ids=list(range(len(words))),
                        logprobs=[-0.5] * len(words),
                        finish_reason="stop",
                    )
                )
        return out
