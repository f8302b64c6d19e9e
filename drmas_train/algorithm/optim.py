"""Optimisation per model: AdamW + warm-up schedule, token-budget micro-batches, clipped steps that skip non-finite norms.

One :class:`ModelOptimizer` per *trainable* model of the pool: a model shared by several agents (Dr. MAS "LLM
sharing") has one optimizer and trains on all of its agents' samples; non-sharing models each have their own.
AdamW runs its fused kernel (one multi-tensor kernel per step, ``torch.optim.AdamW(fused=True)``) where torch has
one for the parameters' device and dtype, and the ``foreach`` implementation otherwise; both compute the same
update as the per-parameter loop up to float rounding.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from drmas_train.algorithm.config import OptimConfig
from drmas_train.model.token_budget import pack_by_token_budget

__all__ = ["ModelOptimizer", "build_optimizer", "micro_batches", "prompt_micro_batches"]


def micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split samples into consecutive micro-batches whose *padded* size fits ``token_budget``.

    A micro-batch of ``k`` samples costs ``k * max(lengths in it)`` tokens (padding included). Samples are sorted
    by length (stable) first so that similar lengths share a batch; a sample longer than the budget gets a
    micro-batch of its own.

    Args:
        lengths: (B,) total tokens (prompt + response) of each sample.
        token_budget: max padded tokens per micro-batch (>= 1).

    Returns:
        lists of sample indices; every index appears exactly once.

    Raises:
        ValueError: ``token_budget < 1``.
    """
    return pack_by_token_budget(lengths, token_budget)


def prompt_micro_batches(
    prompts: Sequence[Sequence[int]], response_lengths: Sequence[int], token_budget: int
) -> list[list[int]]:
    """Micro-batches for the shared-prompt forward: rows with the same prompt kept together, each prompt paid once.

    The forward of a micro-batch with U distinct prompts and k rows feeds ``U * P + k * T`` tokens (P: its longest
    prompt, T: its longest response; :func:`drmas_train.model.logprobs.forward_logprobs` with ``share_prompts``), and
    that is the cost kept within ``token_budget``. Prompt groups are taken shortest prompt first, rows within a
    group shortest response first; a group that does not fit is split across micro-batches (each part then pays
    the prompt again); a row that alone exceeds the budget gets a micro-batch of its own.

    Args:
        prompts: (B,) prompt token ids of each sample (equal sequences share).
        response_lengths: (B,) response tokens of each sample.
        token_budget: max fed tokens per micro-batch (>= 1).

    Returns:
        lists of sample indices; every index appears exactly once.

    Raises:
        ValueError: ``token_budget < 1`` or ``prompts`` and ``response_lengths`` of different lengths.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    if len(prompts) != len(response_lengths):
        raise ValueError(f"got {len(prompts)} prompts but {len(response_lengths)} response lengths")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    out: list[list[int]] = []
    current: list[int] = []
    keys: set[tuple[int, ...]] = set()
    longest_p = longest_t = 0
    for key in sorted(groups, key=len):
        for i in sorted(groups[key], key=lambda j: response_lengths[j]):
            new_p, new_t = max(longest_p, len(key)), max(longest_t, response_lengths[i])
            if current and (len(keys) + (key not in keys)) * new_p + (len(current) + 1) * new_t > token_budget:
                out.append(current)
                current, keys, new_p, new_t = [], set(), len(key), response_lengths[i]
            current.append(i)
            keys.add(key)
            longest_p, longest_t = new_p, new_t
    if current:
        out.append(current)
    return out


def _adamw(params: list[torch.nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel when it supports ``params`` (device type and dtype), else ``foreach``.

    torch validates ``fused=True`` at construction and raises RuntimeError for unsupported devices or dtypes.
    """
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except RuntimeError:
        return torch.optim.AdamW(params, foreach=True, **kwargs)


@dataclass
class ModelOptimizer:
    """AdamW, LR schedule and clipping for one trainable model.

    Attributes:
        model_id: the pool's model id.
        optimizer: ``torch.optim.AdamW`` over the trainable parameters.
        scheduler: ``LambdaLR`` with linear warm-up then constant.
        grad_clip: max total grad norm (L2 over all parameters).
        skipped_steps: steps skipped because the pre-clip norm was nan/inf.
        offload: keep the AdamW state (m, v, step) in host memory outside :meth:`resident` (the reference's
            ``fsdp_config.optimizer_offload``).
    """

    model_id: str
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    grad_clip: float
    skipped_steps: int = 0
    offload: bool = OptimConfig.offload
    _homes: dict[tuple[int, str], torch.device] = field(default_factory=dict, repr=False)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters this optimizer updates."""
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    @property
    def lr(self) -> float:
        """Current learning rate."""
        return float(self.optimizer.param_groups[0]["lr"])

    def step(self) -> tuple[float, bool]:
        """Clip the accumulated gradients, step (unless the norm is non-finite), zero the gradients.

        Returns:
            ``(pre_clip_norm, stepped)``: the total L2 grad norm *before* clipping, and False when it was
            nan/inf and the step was skipped (counted in :attr:`skipped_steps`; the LR schedule still advances
            only on real steps).
        """
        for p in self.params:  # a skipped (all-zero-advantage) micro-batch leaves grad None: the same as zeros
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, error_if_nonfinite=False))
        stepped = math.isfinite(norm)
        if stepped:
            self.optimizer.step()
            self.scheduler.step()
        else:
            self.skipped_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        return norm, stepped

    def _state_tensors(self) -> Iterator[tuple[dict[str, Any], str, torch.Tensor]]:
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                state = self.optimizer.state.get(p, {})
                for key, value in list(state.items()):
                    if isinstance(value, torch.Tensor):
                        yield state, key, value

    def offload_state(self) -> int:
        """Move every tensor of the AdamW state to host memory (DTensor shards move their local shard), remembering
        where each one lived. Returns the bytes moved."""
        moved = 0
        for state, key, value in self._state_tensors():
            if value.device.type != "cpu":
                self._homes[(id(state), key)] = value.device
                state[key] = value.to("cpu", non_blocking=True)
                moved += value.numel() * value.element_size()
        return moved

    def restore_state(self) -> None:
        """Inverse of :meth:`offload_state`: every offloaded tensor back to the device it came from."""
        for state, key, value in self._state_tensors():
            home = self._homes.pop((id(state), key), None)
            if home is not None:
                state[key] = value.to(home, non_blocking=True)

    @contextlib.contextmanager
    def resident(self) -> Iterator[None]:
        """The AdamW state on its devices inside the block; with :attr:`offload`, in host memory after it (and the
        CUDA cache emptied), so a GPU holds only weights and gradients between updates: 8 bytes per (sharded)
        float32 parameter less during generation, for one host <-> device copy of the state per update. The
        reference's order: load before the update, offload after (``langfengQ/DrMAS
        verl/workers/fsdp_workers.py:605-608,636-637``; ``verl/utils/fsdp_utils.py:188-210``). A no-op without
        :attr:`offload`, or when the state lives in host memory anyway (CPU training)."""
        if not self.offload:
            yield
            return
        self.restore_state()
        try:
            yield
        finally:
            if self.offload_state() and torch.cuda.is_available():
                torch.cuda.synchronize()
                torch.cuda.empty_cache()

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, scheduler and skip-counter state (for checkpoints)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])  # torch puts the state on its parameters' devices
        self.scheduler.load_state_dict(state["scheduler"])
        self.skipped_steps = int(state["skipped_steps"])
        self.after_load()

    def after_load(self) -> None:
        """Call after the AdamW state was loaded in place (it lands on the parameters' devices): offloads it again
        with :attr:`offload`."""
        self._homes.clear()
        if self.offload:
            self.offload_state()


def build_optimizer(
    model_id: str,
    model: torch.nn.Module,
    *,
    lr: float | None = None,
    weight_decay: float | None = None,
    betas: Sequence[float] | None = None,
    warmup_steps: int | None = None,
    grad_clip: float | None = None,
    offload: bool | None = None,
    params: Sequence[torch.nn.Parameter] | None = None,
) -> ModelOptimizer:
    """AdamW (Loshchilov & Hutter, arXiv 1711.05101) over ``model``'s trainable parameters.

    A setting left ``None`` takes the ``optim`` config section's default
    (:class:`drmas_train.algorithm.config.OptimConfig`: the Dr. MAS / verl reference's lr 1e-6, weight decay 0.01,
    grad clip 1.0, no offload), the one place those defaults live. ``offload``: :attr:`ModelOptimizer.offload`. With
    LoRA only the adapter weights require grad, so only they are optimised; ``params`` names the parameters instead
    (one LoRA adapter of several on one base, :func:`drmas_train.model.adapters.adapter_parameters`). The fused kernel
    is used where available (``opt.optimizer.defaults["fused"]`` tells which).

    Raises:
        ValueError: the model has no trainable parameter, or lr / grad_clip <= 0.
    """
    d = OptimConfig()
    lr = d.lr if lr is None else lr
    weight_decay = d.weight_decay if weight_decay is None else weight_decay
    betas = d.betas if betas is None else betas
    warmup_steps = d.warmup_steps if warmup_steps is None else warmup_steps
    grad_clip = d.grad_clip if grad_clip is None else grad_clip
    offload = d.offload if offload is None else offload
    params = [p for p in model.parameters() if p.requires_grad] if params is None else list(params)
    if not params:
        raise ValueError(f"model {model_id!r} has no trainable parameters; set trainable: true or remove it from training")
    if not (lr > 0 and grad_clip > 0):
        raise ValueError(f"lr and grad_clip must be > 0, got lr={lr}, grad_clip={grad_clip}")
    opt = _adamw(params, lr=lr, weight_decay=weight_decay, betas=(float(betas[0]), float(betas[1])))
    warm = max(int(warmup_steps), 0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warm) if warm else 1.0)
    return ModelOptimizer(model_id, opt, sched, float(grad_clip), offload=bool(offload))
