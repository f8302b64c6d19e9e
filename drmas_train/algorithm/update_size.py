"""How far an optimizer step moved a model's weights: the relative update size and the share of weights that changed.

A step can compute a sound gradient and still leave the weights where they were: AdamW on bf16 parameters at
lr 1e-6 rounds ~98 % of its steps away (a step below half a weight's spacing is lost;
:mod:`drmas_train.model.precision`). Neither the loss nor the grad norm shows that; these metrics do:

* ``update_rel`` = ‖θ_after − θ_before‖₂ / ‖θ_before‖₂ over the trained parameters (dimensionless; AdamW at lr η moves
  each weight by about η, so a healthy value is of the order η·√N / ‖θ‖);
* ``update_changed_frac``: the share of the weights with a non-zero gradient whose value changed at all (1.0 for
  float32 masters; about 0.02 for bf16 weights stepped directly at lr 1e-6).

Both are measured on a fixed strided sample of each parameter tensor (at most :data:`SAMPLE_PER_TENSOR` elements
each: 2 copies of the sample, a few MB for a 135M model, whatever the model's size), so they are estimates for large
tensors and exact for small ones. A parameter sharded over ranks (FSDP2 ``DTensor``) is sampled on each rank's local
shard and the sums are added over the ranks (``sum_shards``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["SAMPLE_PER_TENSOR", "MIN_CHANGED_FRAC", "UpdateSizeProbe", "update_size_metrics", "stalled_updates"]

#: at most this many elements of each parameter tensor are compared before and after a step.
SAMPLE_PER_TENSOR = 4096


def _local(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` this process holds (a DTensor's local shard), flattened."""
    return (t.to_local() if hasattr(t, "to_local") else t).reshape(-1)


def _sample_index(n: int, k: int) -> torch.Tensor | None:
    """Strided indices of at most ``k`` of ``n`` elements (None: all of them)."""
    return None if n <= k else torch.arange(0, n, n // k)[:k]


class UpdateSizeProbe:
    """Compares a fixed sample of ``params`` just before and just after an optimizer step.

    Call :meth:`before` after the backward passes and before ``optimizer.step()`` (it reads the gradients), then
    :meth:`after`. Sums accumulate over steps until :meth:`metrics`.

    Args:
        params: the trained parameters (any dtype; DTensors are read on their local shard).
        sum_shards: adds a float64 vector over the processes that each hold a part of the parameters (the identity
            for one process; :attr:`drmas_train.algorithm.update.UpdateHooks.sum_shards`).
        sample_per_tensor: elements compared per tensor.
    """

    def __init__(self, params: Sequence[torch.Tensor], sum_shards: Callable[[torch.Tensor], torch.Tensor] = lambda v: v,
                 sample_per_tensor: int = SAMPLE_PER_TENSOR) -> None:  # fmt: skip
        self.params = list(params)
        self.sum_shards = sum_shards
        self.index = [_sample_index(_local(p).numel(), sample_per_tensor) for p in self.params]
        self._before: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._totals = torch.zeros(4, dtype=torch.float64)  # Σ‖Δθ‖², Σ‖θ‖², changed, with a non-zero gradient
        self.steps = 0

    def _take(self, t: torch.Tensor, i: int) -> torch.Tensor:
        flat = _local(t)
        idx = self.index[i]
        return (flat if idx is None else flat[idx.to(flat.device)]).detach().to(torch.float64)

    @torch.no_grad()
    def before(self) -> None:
        """Snapshot the sampled weights, and which of them have a non-zero gradient."""
        self._before = []
        for i, p in enumerate(self.params):
            grad = torch.zeros(0) if p.grad is None else self._take(p.grad, i)
            nonzero = (grad != 0) if grad.numel() else torch.zeros(0, dtype=torch.bool)
            self._before.append((self._take(p, i).clone(), nonzero))

    @torch.no_grad()
    def after(self) -> None:
        """Add this step's differences to the totals (a step skipped for a non-finite norm adds zeros)."""
        sums = torch.zeros(4, dtype=torch.float64)
        for i, (p, (old, nonzero)) in enumerate(zip(self.params, self._before, strict=True)):
            new = self._take(p, i)
            diff = (new - old).cpu()
            old = old.cpu()
            sums[0] += float((diff * diff).sum())
            sums[1] += float((old * old).sum())
            if nonzero.numel():
                nonzero = nonzero.cpu()
                sums[2] += float(((diff != 0) & nonzero).sum())
                sums[3] += float(nonzero.sum())
        self._totals += self.sum_shards(sums)
        self.steps += 1
        self._before = []

    def metrics(self) -> dict[str, float]:
        """:func:`update_size_metrics` of the steps so far; {} before any step."""
        return update_size_metrics(self._totals, self.steps)


def update_size_metrics(totals: torch.Tensor, steps: int) -> dict[str, float]:
    """The metrics of :class:`UpdateSizeProbe` from its totals ``(Σ‖Δθ‖², Σ‖θ‖², changed, non-zero-gradient)`` over
    ``steps`` steps: ``update_rel`` = √(Σ‖Δθ‖² / Σ‖θ‖²) (the root-mean-square of the steps' relative updates when
    ‖θ‖ barely moves), ``update_changed_frac`` = changed / non-zero-gradient (NaN when no weight had a gradient)."""
    if steps == 0:
        return {}
    d2, t2, changed, counted = (float(x) for x in totals)
    rel = (d2 / t2) ** 0.5 if t2 > 0 else float("nan")
    return {"update_rel": rel, "update_changed_frac": changed / counted if counted else float("nan")}


#: an update whose share of changed weights (among those with a gradient) is below this has stalled.
MIN_CHANGED_FRAC = 0.5


def stalled_updates(metrics: dict[str, float], min_changed: float = MIN_CHANGED_FRAC) -> dict[str, float]:
    """``model_id -> update_changed_frac`` of the models whose update had a non-zero gradient
    (``loss/<m>/grad_norm`` > 0) but changed less than ``min_changed`` of the weights that had one: the update was
    (mostly) rounded away. Reads the trainer's namespaced metrics (``loss/<m>/update_changed_frac``)."""
    out = {}
    for key, frac in metrics.items():
        if key.startswith("loss/") and key.endswith("/update_changed_frac"):
            model_id = key.removeprefix("loss/").removesuffix("/update_changed_frac")
            grad = metrics.get(f"loss/{model_id}/grad_norm", 0.0)
            if grad and grad > 0 and frac == frac and frac < min_changed:  # frac == frac: not NaN
                out[model_id] = float(frac)
    return out
