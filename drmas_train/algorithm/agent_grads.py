"""Per-agent parts of a model's gradient: which agent's samples drive each optimizer step.

Shape legend: **B** samples (agent calls) of one model, **A** agents that the model plays, **P** parameters.

The PPO loss of a mini-batch is a sum of per-sample terms, each divided by a fixed denominator
(:func:`drmas_train.algorithm.losses.aggregate`), so its gradient is exactly the sum of the gradients of each
agent's samples::

    g = sum_k g_k                    g_k = gradient of the loss terms of agent k's samples

Norms do not add (``||g|| <= sum_k ||g_k||``, the triangle inequality), but inner products with the total do::

    ||g||^2 = <g, g> = sum_k <g_k, g>          so   sum_k share_k = 1,   share_k = <g_k, g> / ||g||^2

(``share_k`` may be negative when an agent's gradient opposes the others'). That is the exact statement the update
reports: per agent ``||g_k||`` and ``share_k`` (tested against per-agent gradients computed one by one in
``tests/drmas_train/run/test_agent_health.py``). Under independent per-token gradient noise ``E||g_k||^2`` grows with the
agent's loss weight times its advantage second moment ``E_k[A^2]``, so ``share_k / loss_share_k`` estimates the
agent's Prop. 4.3 factor relative to the model's average (Dr. MAS, arXiv 2602.08847, Sec. 4; docs/stability.md).

**How it is measured** (exact, no estimate): the update orders each mini-batch's micro-batches by agent
(:func:`agent_segments`) and reads the accumulated gradient after each agent's part: the gradient after agent k minus
the one after agent k-1 is ``g_k``. :class:`AgentGradients` keeps ``A - 1`` copies of the gradient per step (the last
agent's part is the final gradient minus the last copy), computes the inner products of the cumulative gradients in
float64 (chunk by chunk, parameter by parameter), from which ``||g_k||^2`` and ``<g_k, g>`` follow, and frees the
copies before the optimizer steps. A data-parallel update synchronises the
gradients at the end of each agent's part (so the copies hold the reduced gradient); sharded gradients (FSDP2) give
each rank a part of every sum, added over the ranks by ``sum_shards`` (:attr:`~drmas_train.algorithm.update.UpdateHooks.sum_shards`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["AgentGradients", "agent_segments", "AGENT_PREFIX", "namespaced"]

#: metrics of one agent are named ``agent/<agent_id>/<metric>`` (not per model: an agent belongs to one model).
AGENT_PREFIX = "agent/"
#: gradient elements converted to float64 at a time by :meth:`AgentGradients._gram`.
CHUNK = 1 << 18


def namespaced(model_id: str, metrics: dict[str, float]) -> dict[str, float]:
    """An update's metrics in the run's namespaces: ``agent/<a>/...`` as they are, the rest as
    ``loss/<model_id>/<metric>``."""
    return {k if k.startswith(AGENT_PREFIX) else f"loss/{model_id}/{k}": v for k, v in metrics.items()}


def agent_segments(
    agents: Sequence[str], plan: Callable[[list[int]], list[list[int]]]
) -> list[tuple[str, list[list[int]]]]:
    """Micro-batches of one mini-batch, agent by agent.

    Args:
        agents: (B,) the agent of each sample.
        plan: ``plan(indices) -> micro-batches`` of those samples (lists of positions into ``indices``).

    Returns:
        ``[(agent, micro-batches), ...]`` in sorted agent order, every micro-batch a list of sample indices into
        ``agents``; every index appears exactly once.
    """
    out = []
    for agent in sorted(set(agents)):
        idx = [i for i, a in enumerate(agents) if a == agent]
        out.append((agent, [[idx[j] for j in micro] for micro in plan(idx)]))
    return out


def _local(grad: torch.Tensor | None) -> torch.Tensor | None:
    """This process's part of a gradient: the local shard of a DTensor (FSDP2), else the tensor itself."""
    if grad is None:
        return None
    to_local = getattr(grad, "to_local", None)
    return to_local() if callable(to_local) else grad


class AgentGradients:
    """The per-agent parts of each optimizer step's gradient of one model, and their statistics over the update.

    Call :meth:`after_agent` after each agent's micro-batches of a mini-batch (its gradients synchronised), then
    :meth:`end_step` before the optimizer step (which zeroes the gradients).

    Args:
        params: (P,) the parameters whose gradient is split (the optimizer's).
        sum_shards: adds a float64 vector over the processes that hold parts of the gradient (FSDP2 shards); the
            identity when this process holds all of it (one process, or DDP replicas).
    """

    def __init__(
        self, params: Sequence[torch.nn.Parameter], sum_shards: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.params, self.sum_shards = list(params), sum_shards
        self._agents: list[str] = []
        self._copies: list[list[torch.Tensor | None]] = []
        self._steps: list[tuple[dict[str, float], dict[str, float], float]] = []  # (|g_k|^2, <g_k, g>, |g|^2)
        self._weights: dict[str, float] = {}

    def add_loss_weight(self, agent: str, weight: float) -> None:
        """Count ``weight`` (a sample's loss weight: its tokens over its divisor) for ``agent``."""
        self._weights[agent] = self._weights.get(agent, 0.0) + float(weight)

    def after_agent(self, agent: str, *, last: bool = False) -> None:
        """Mark the end of ``agent``'s part of the current step: a copy of the gradient is kept, except after the
        step's ``last`` agent (its part ends at the live gradient)."""
        self._agents.append(agent)
        if not last:
            self._copies.append(
                [None if (g := _local(p.grad)) is None else g.detach().clone() for p in self.params]
            )

    def _gram(self) -> torch.Tensor:
        """(A, A) float64: inner products of the cumulative gradients ``S_1 .. S_A`` (``S_k``: the gradient after
        agent k's part; ``S_A`` the live one) over this process's part of the parameters.

        Float32 values multiply exactly in float64, so each product is accumulated exactly enough for the split's
        identities to hold to float64 rounding; chunks of :data:`CHUNK` elements are converted into buffers kept for
        the whole call (no allocation per parameter, which dominated the cost of converting whole tensors).
        """
        n = len(self._agents)
        device = next((_local(p.grad).device for p in self.params if p.grad is not None), None)
        if device is None:
            device = next((p.device for p in self.params), torch.device("cpu"))
        gram = torch.zeros(n, n, dtype=torch.float64, device=device)
        buffers = torch.empty(n, CHUNK, dtype=torch.float64, device=device)
        for j, p in enumerate(self.params):
            total = _local(p.grad)
            if total is None or total.numel() == 0:
                continue
            copies = self._copies[
                : n - 1
            ]  # a copy after the last agent (if one was kept) is the live gradient
            parts = [None if c[j] is None else c[j].reshape(-1) for c in copies] + [
                total.detach().reshape(-1)
            ]
            size = parts[-1].numel()
            for start in range(0, size, CHUNK):
                m = min(CHUNK, size - start)
                for i, part in enumerate(parts):
                    if part is None:
                        buffers[i, :m].zero_()
                    else:
                        buffers[i, :m].copy_(part[start : start + m])
                block = buffers[:, :m]
                gram += block @ block.T
        return gram

    def end_mini_batch(self, samples: Sequence[Any], layout: Any, mini_batch: int, loss_agg: str) -> None:
        """Count the loss weight of every sample of mini-batch ``mini_batch`` of ``layout`` (skipped ones too: they
        keep their divisor), then :meth:`end_step`. A sample's weight is its tokens (one for ``seq-mean-token-mean``)
        over its divisor (:class:`~drmas_train.algorithm.batch_layout.LossLayout`)."""
        for i in np.flatnonzero(layout.mini_batch == mini_batch):
            mass = sum(samples[i].response_mask) if loss_agg != "seq-mean-token-mean" else 1.0
            self.add_loss_weight(samples[i].agent_id, mass / layout.denom[i])
        self.end_step()

    def end_step(self) -> None:
        """Split the current step's gradient into its agents' parts (from :meth:`_gram`, summed over the processes
        holding parts of it); frees the copies. With ``g_k = S_k - S_{k-1}`` (``S_0 = 0``):
        ``|g_k|^2 = G_kk - 2 G_k,k-1 + G_k-1,k-1`` and ``<g_k, g> = G_kA - G_k-1,A``."""
        if not self._agents:  # a mini-batch whose every advantage is 0 (skipped): a step with a zero gradient
            self._steps.append(({}, {}, 0.0))
            return
        n = len(self._agents)
        gram = self.sum_shards(self._gram()).cpu()
        self._copies = []
        padded = torch.zeros(n + 1, n + 1, dtype=torch.float64)  # index 0: S_0 = 0
        padded[1:, 1:] = gram
        stats = torch.zeros(2 * n + 1, dtype=torch.float64)
        for k in range(1, n + 1):
            stats[k - 1] = padded[k, k] - 2 * padded[k, k - 1] + padded[k - 1, k - 1]
            stats[n + k - 1] = padded[k, n] - padded[k - 1, n]
        stats[2 * n] = padded[n, n]
        sq = dict.fromkeys(self._agents, 0.0)
        dot = dict.fromkeys(self._agents, 0.0)
        for k, agent in enumerate(self._agents):
            sq[agent] += float(stats[k])
            dot[agent] += float(stats[n + k])
        self._steps.append((sq, dot, float(stats[2 * n])))
        self._agents, self._copies = [], []

    def metrics(self) -> dict[str, float]:
        """Per agent, over the update's steps with a finite gradient:

        * ``agent/<a>/grad_norm``, ``agent/<a>/grad_norm_max``: mean and max over steps of ``||g_k||`` (pre-clip, as
          the model's ``grad_norm``; 0 in a step without the agent's samples);
        * ``agent/<a>/grad_share``: ``sum_steps <g_k, g> / sum_steps ||g||^2``; the shares of a model's agents add
          up to 1 (up to float rounding);
        * ``agent/<a>/loss_share``: the agent's share of the loss weight (tokens over divisor) of the update;
        * ``agent/<a>/grad_ratio``: ``grad_share / loss_share`` (1 = a gradient in proportion to its samples).
        """
        steps = [s for s in self._steps if math.isfinite(s[2]) and all(map(math.isfinite, s[0].values()))]
        agents = sorted({a for s in steps for a in s[0]} | set(self._weights))
        if not steps or not agents:
            return {}
        total_sq = sum(s[2] for s in steps)
        total_w = sum(self._weights.values())
        out: dict[str, float] = {}
        for a in agents:
            norms = [math.sqrt(max(s[0].get(a, 0.0), 0.0)) for s in steps]
            share = sum(s[1].get(a, 0.0) for s in steps) / total_sq if total_sq > 0 else float("nan")
            weight = self._weights.get(a, 0.0) / total_w if total_w > 0 else float("nan")
            out[f"{AGENT_PREFIX}{a}/grad_norm"] = float(np.mean(norms))
            out[f"{AGENT_PREFIX}{a}/grad_norm_max"] = float(np.max(norms))
            out[f"{AGENT_PREFIX}{a}/grad_share"] = share
            out[f"{AGENT_PREFIX}{a}/loss_share"] = weight
            out[f"{AGENT_PREFIX}{a}/grad_ratio"] = share / weight if weight > 0 else float("nan")
        return out

    def step_parts(self) -> list[tuple[dict[str, float], dict[str, float], float]]:
        """Every step's ``(||g_k||^2 per agent, <g_k, g> per agent, ||g||^2)`` (tests read them)."""
        return list(self._steps)
