"""The critic of PPO: a value model per trainable model (or per agent), and its per-token values of responses.

Shape legend: **B** samples (agent calls), **P** prompt tokens (left-padded), **T** response tokens (right-padded).

A :class:`ValueModel` is a copy of a causal LM's decoder with a linear value head in place of the LM head: the
reference's critic is the same architecture (``AutoModelForTokenClassification`` with one label, initialised from
the actor's checkpoint: ``langfengQ/DrMAS verl/workers/fsdp_workers.py:843-890``, ``_build_critic_model_optimizer``;
``examples/ppo_trainer/run_math.sh`` sets ``critic.model.path`` to the actor's model). Its forward returns a
``TokenClassifierOutput`` whose ``logits`` (B, L, 1) are the values of every position, as the reference reads them.

:func:`forward_values` gives ``V_t`` for each response token ``t``: the value at the position that predicts token
``t``, i.e. of the state "prompt + the response's first ``t`` tokens" (the reference's
``values[:, -T - 1 : -1]``, ``verl/workers/critic/dp_critic.py:116``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers.modeling_outputs import TokenClassifierOutput

from drmas_train.model.logprobs import (
    Forward,
    pack_prompt_response,
    shared_prompt_hidden,
    worth_sharing_prompts,
)
from drmas_train.model.precision import COMPUTE_ATTR, mark_compute_dtype
from drmas_train.model.weights import is_peft

__all__ = ["ValueModel", "forward_values", "save_value_model", "load_value_model"]


class ValueModel(torch.nn.Module):
    """A decoder with a scalar value head: ``values = head(decoder(ids).last_hidden_state)`` (B, L).

    Args:
        decoder: a Hugging Face decoder (``model.get_decoder()``: embeddings, layers, final norm).
        hidden_size: its hidden size. no_split_modules: the decoder layer class names (FSDP2 shards each of them,
            :func:`drmas_train.distributed.data_parallel.wrap_model`).
    """

    def __init__(
        self, decoder: torch.nn.Module, hidden_size: int, *, no_split_modules: Sequence[str] = ()
    ) -> None:
        super().__init__()
        self.decoder = decoder
        param = next(decoder.parameters())
        self.value_head = torch.nn.Linear(hidden_size, 1, device=param.device, dtype=param.dtype)
        self._no_split_modules = list(no_split_modules)

    @property
    def config(self) -> Any:
        """The decoder's Hugging Face config."""
        return self.decoder.config

    @classmethod
    def from_causal_lm(cls, lm: Any, *, seed: int) -> ValueModel:
        """A critic initialised from ``lm``'s current weights (a copy: the policy is not touched; a LoRA policy's
        adapters are merged into the copy), every weight trainable, the head drawn from N(0, initializer_range^2)
        with ``seed`` and a zero bias (Hugging Face's initialisation of a token-classification head).

        Raises:
            ValueError: ``lm`` has no separate decoder (``get_decoder()``).
        """
        base = copy.deepcopy(lm).merge_and_unload() if is_peft(lm) else lm
        decoder = base.get_decoder() if hasattr(base, "get_decoder") else None
        if decoder is None or decoder is base:
            raise ValueError(
                f"{type(lm).__name__} has no separate decoder (get_decoder()): it cannot carry a value head"
            )
        decoder = decoder if base is not lm else copy.deepcopy(decoder)
        config = base.config
        model = cls(
            decoder, int(config.hidden_size), no_split_modules=getattr(base, "_no_split_modules", None) or ()
        )
        gen = torch.Generator().manual_seed(int(seed))
        std = float(getattr(config, "initializer_range", 0.02))
        with torch.no_grad():
            w = torch.randn(model.value_head.weight.shape, generator=gen) * std
            model.value_head.weight.copy_(w.to(model.value_head.weight.dtype))
            model.value_head.bias.zero_()
        if hasattr(lm, COMPUTE_ATTR):  # float32 masters of a bf16 policy: the critic computes as its policy does
            mark_compute_dtype(model, getattr(lm, COMPUTE_ATTR))
        return model.requires_grad_(True).train(lm.training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **_: Any) -> TokenClassifierOutput:  # fmt: skip
        """Values of every position: ``logits`` (B, L, 1) float32."""
        hidden = self.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state  # (B, L, H)  # fmt: skip
        return TokenClassifierOutput(logits=self.value_head(hidden).float())


def forward_values(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``V_t`` of every response token under the critic ``model``, one batched forward (gradients flow).

    Args:
        model: a :class:`ValueModel` (or a :class:`~drmas_train.model.logprobs.Forward` over a wrapped one: its
            ``call`` is used, so a wrapper's hooks run; with shared prompts its ``run``). prompt_ids: B prompts
            (non-empty). response_ids: B responses.
        pad_token_id: the tokenizer's pad id.
        share_prompts: compute each distinct prompt once, its key/value cache repeated for the rows that share it
            (the policy's shared-prompt forward, :mod:`drmas_train.model.logprobs`; the same values and gradients up
            to float rounding). Used when some prompt repeats and the decoder's cache can be shared
            (:func:`~drmas_train.model.prefill.can_stitch`, no activation checkpointing); otherwise ignored.

    Returns:
        ``(values, mask)``: (B, T) float32 values (0 on padding) and the (B, T) float32 response mask.

    Raises:
        ValueError: see :func:`~drmas_train.model.logprobs.pack_prompt_response`.
    """
    fwd = Forward.of(model)
    device = next(fwd.module.parameters()).device
    resp_len = max((len(r) for r in response_ids), default=0)
    if resp_len == 0:
        empty = torch.zeros((len(response_ids), 0), device=device)
        return empty, empty.clone()
    module = fwd.module
    if share_prompts and worth_sharing_prompts(module, prompt_ids):
        def shared() -> tuple[torch.Tensor, torch.Tensor]:
            hidden, mask = shared_prompt_hidden(module, module.decoder, prompt_ids, response_ids, pad_token_id, device)
            return module.value_head(hidden).float()[..., 0] * mask, mask  # (B, T): row b's position t predicts token t

        return fwd.run(shared)  # the decoder and head are called directly: inside a wrapper's forward, if any
    # prompt + response[:-1]: the position before response token t holds V_t (the last token's successor is terminal)
    ids, attention, positions, _ = pack_prompt_response(
        prompt_ids, [list(r)[:-1] for r in response_ids], pad_token_id, device
    )
    prompt_len = max(len(p) for p in prompt_ids)
    logits = fwd.call(
        input_ids=ids, attention_mask=attention, position_ids=positions
    ).logits  # (B, P + T - 1, 1)
    lengths = torch.as_tensor([len(r) for r in response_ids], device=device).unsqueeze(-1)
    mask = (torch.arange(resp_len, device=device) < lengths).to(torch.float32)  # (B, T)
    return logits[:, prompt_len - 1 : prompt_len - 1 + resp_len, 0] * mask, mask


def save_value_model(model: ValueModel, folder: str | Path) -> None:
    """Write ``folder/value_model.safetensors`` (the critic's weights)."""
    from safetensors.torch import save_model

    Path(folder).mkdir(parents=True, exist_ok=True)
    save_model(model, str(Path(folder) / "value_model.safetensors"))


def load_value_model(model: ValueModel, folder: str | Path) -> None:
    """Inverse of :func:`save_value_model` (strict: every weight must be there).

    Raises:
        FileNotFoundError: no ``value_model.safetensors`` in ``folder``.
    """
    from safetensors.torch import load_model

    file = Path(folder) / "value_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"no critic weights at {file}")
    load_model(model, str(file))
