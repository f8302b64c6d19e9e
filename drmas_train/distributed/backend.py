"""The ``ray`` backend: the :class:`~drmas_train.backends.base.Backend` protocol over a model's worker group.

The driver renders and truncates the prompts with the model's tokenizer (exactly as the in-process ``hf``
backend does), then the group's engines (:meth:`GenerationEngines.generate_ids`) spread the rows over the generation workers. The lock-step
rollout (:func:`drmas_train.collect.rollout.rollout`) is unchanged: it makes one batched call per model per step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drmas_train.backends.base import ChatTokenBackend, Generation, SamplingParams

__all__ = ["RayBackend"]


class RayBackend(ChatTokenBackend):
    """Generate with a :class:`~drmas_train.distributed.worker_group.WorkerGroup`.

    Args:
        group: the model's worker group. tokenizer: the model's tokenizer (chat template + pad token).
        chat_template_kwargs: passed to the chat template (e.g. ``{"enable_thinking": False}``).
    """

    def __init__(self, group: Any, tokenizer: Any, *, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.group, self.tokenizer = group, tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def sync_weights(self, model: Any = None) -> None:
        """No-op: the training ranks push their weights to the generation workers after every update."""

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Generation]:
        """Like :meth:`generate` for prompts already tokenized (each non-empty)."""
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt must have at least one token")
        if not prompt_ids:
            return []
        return self.group.engines.generate_ids(prompt_ids, sampling)  # faults re-issued and counted there
