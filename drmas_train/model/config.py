"""The ``models`` section of the training config: one entry per model of the agent -> model assignment.

Agents naming the same model key share its weights (Dr. MAS "LLM sharing"); different keys never do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from drmas_train.errors import require
from drmas_train.model.models import DTYPES

__all__ = ["LoraConfig", "ModelConfig"]


@dataclass
class LoraConfig:
    """LoRA adapter settings (peft ``LoraConfig``; Hu et al. 2021, arXiv 2106.09685)."""

    r: int = 16
    """adapter rank."""
    alpha: int = 32
    """scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """dropout on the adapter input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """module names that get adapters."""


@dataclass
class ModelConfig:
    """One model of the agent -> model assignment; agents naming the same model key share its weights."""

    name_or_path: str = "smollm2-135m-instruct"
    """a named offline model (``smollm2-135m-instruct``, ``tiny-qwen3``, ...), a local path or an HF id."""
    dtype: str = "float32"
    """``float32`` | ``bfloat16`` | ``float16``."""
    device: str = "cpu"
    """torch device, e.g. ``cpu`` or ``cuda:0``."""
    backend: str = "hf"
    """rollout backend: ``hf`` (transformers, the default) or ``vllm``."""
    trainable: bool = True
    """False: the model acts but is never updated (a frozen agent)."""
    lora: LoraConfig | None = None
    """train LoRA adapters instead of all weights (null = full fine-tuning)."""
    adapters: dict[str, LoraConfig] = field(default_factory=dict)
    """several LoRA adapters on this model's base weights, held once, e.g. one per agent: ``{solver: {r: 16},
    verifier: {r: 16}}``, each trained by its own optimizer; an agent plays one with ``agents.<agent>:
    <key>:<adapter>`` (:mod:`drmas_train.model.adapters`). Empty = no adapters (``lora`` or full weights)."""
    lr: float | None = None
    """per-model override of ``optim.lr``."""
    weight_decay: float | None = None
    """per-model override of ``optim.weight_decay``."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """passed to the chat template (e.g. ``{enable_thinking: false}`` for Qwen3)."""

    def validate(self, key: str) -> None:
        """Check this entry (``models.<key>``); its ``backend`` is checked by the run's config against the engines
        of :mod:`drmas_train.backends`.

        Raises:
            ConfigError: naming the key, the bad value and what is accepted.
        """
        require(self.dtype in DTYPES, f"models.{key}.dtype={self.dtype!r}; accepted: {', '.join(DTYPES)}")
        require(not (self.adapters and self.lora is not None),
                f"models.{key}: give lora (one adapter) or adapters (several on one base), not both")  # fmt: skip
        for name in self.adapters:
            require(re.fullmatch(r"[A-Za-z0-9_-]+", str(name)) is not None and str(name) not in "lora_",
                    f"models.{key}.adapters.{name}: adapter names take letters, digits, '_' and '-' only, and not a "
                    "part of 'lora_' (PEFT's weight prefix), e.g. the agent's name")  # fmt: skip
        require(not self.adapters or self.backend == "hf",
                f"models.{key}.backend={self.backend!r} with adapters; accepted: hf (one engine per adapter over the "
                "shared base; a vLLM engine would merge an adapter into the base)")  # fmt: skip
