"""Monte Carlo check of the Dr. MAS gradient-norm argument (arXiv 2602.08847, Sec. 4, Proposition 4.3).

Setting (the paper's): K agents share one prompt group. A fraction ``p_k`` (the *sample share*) of the group's
agent calls belongs to agent k, and each of its calls earns a Bernoulli(``q_k``) reward. Pooled over the group
the rewards are a mixture with mean ``mu = sum_k p_k q_k`` and variance ``sigma^2 = mu (1 - mu)`` (a mixture of
Bernoullis is Bernoulli). Normalising every call with the *global* group baseline, ``A = (r - mu) / sigma``,
gives agent k the advantage second moment (Proposition 4.3)::

    E_k[A^2] = (sigma_k^2 + (mu_k - mu)^2) / sigma^2,      sigma_k^2 = q_k (1 - q_k),  mu_k = q_k

and by the law of total variance ``sum_k p_k E_k[A^2] = 1``: one agent's inflation is another's deflation.
Agent-wise normalisation (Dr. MAS, Eq. (5)) standardises each agent's calls with its own mean/std, so every
factor is 1. A policy-gradient sample is ``g = A * grad log pi``; with a score vector ``z`` independent of the
reward, ``E||g||^2 = E[A^2] E||z||^2``. Here ``z ~ N(0, I_d)``, so the mean of ``||g||^2`` over agent k's calls
is ``d * E_k[A^2]``: the agent with the inflated factor gets the larger gradients.

What is simulated (all advantages come from :mod:`drmas_train.algorithm.advantages`, never re-implemented here):

* ``n_groups`` prompt groups (``uid``) of ``group_size`` agent calls each. Within every group agent k gets
  exactly ``round(p_k * group_size)`` calls (stratified, so the shares are exact), and the calls are shuffled and
  cut into trajectories of ``calls_per_traj`` consecutive calls (``traj_uid``), so a trajectory's agent mix is
  random (hypergeometric) with the right mean.
* ``grpo_step`` is the *global normalisation* of Proposition 4.3: per ``uid`` it pools all calls of all agents,
  each keeping its own reward. ``drmas`` pools per (``uid``, ``agent_id``). ``grpo`` (the paper's vanilla
  baseline, trajectory-averaged) is reported too: every call inherits its trajectory's standardised *mean*
  score, so an agent's own per-call gap never enters. With the same agent mix in every trajectory all its
  factors are equal; with the random mix simulated here, trajectories holding more calls of the off-distribution
  agent score more extremely, a milder inflation (1.27 vs 4.12 for ``grpo_step`` in the 0.9/0.1 case). Its
  cost is credit assignment (a call's advantage barely depends on its own reward), not scale.
* **Finite groups.** The estimators use the unbiased (n - 1) std by default (as the reference), so within one
  group ``sum A^2 = n - 1`` exactly: the empirical ``grpo_step`` weighted sum is ``(M - 1) / M`` and each
  ``drmas`` factor ``(n_k - 1) / n_k`` (lower still if an agent's group happens to be constant, which gets
  A = 0). With the default ``group_size=2000`` (agent calls per group) this bias is <= 0.5 % for shares >= 0.1;
  ``--population`` switches to the population (n) std, which removes it (``sum A^2 = n`` exactly).

Run (prints JSON)::

    python benchmarks/stability/theory.py --shares 0.9 0.1 --success 0.9 0.1
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from drmas_train.algorithm.advantages import get_estimator

__all__ = ["closed_form_factors", "simulate", "main"]

#: estimators compared by default: global (Prop. 4.3), agent-wise (Dr. MAS), trajectory-averaged GRPO.
DEFAULT_ESTIMATORS = ("grpo_step", "drmas", "grpo")


def _check_inputs(shares: Sequence[float], success: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(shares, dtype=np.float64).reshape(-1)
    q = np.asarray(success, dtype=np.float64).reshape(-1)
    if p.size == 0:
        raise ValueError("shares must name at least one agent, got an empty sequence")
    if p.shape != q.shape:
        raise ValueError(f"shares and success must have one entry per agent, got {p.size} and {q.size}")
    if not np.all(np.isfinite(p)) or np.any(p <= 0) or abs(p.sum() - 1.0) > 1e-6:
        raise ValueError(f"shares must be positive and sum to 1, got {p.tolist()} (sum {p.sum():.6g})")
    if not np.all(np.isfinite(q)) or np.any(q < 0) or np.any(q > 1):
        raise ValueError(f"success rates must lie in [0, 1], got {q.tolist()}")
    mu = float(p @ q)
    if mu * (1.0 - mu) <= 0.0:
        raise ValueError(
            f"the pooled reward has zero variance (mixture mean {mu:g}): every agent always succeeds or always "
            "fails, so no normalisation is defined"
        )
    return p, q


def closed_form_factors(shares: Sequence[float], success: Sequence[float]) -> np.ndarray:
    """Proposition 4.3 inflation factors ``E_k[A^2]`` under global normalisation, Bernoulli rewards.

    Args:
        shares: (K,) sample shares ``p_k`` > 0, summing to 1.
        success: (K,) success rates ``q_k`` in [0, 1] (agent k's reward is Bernoulli(q_k)).

    Returns:
        (K,) float64 ``(q_k (1 - q_k) + (q_k - mu)^2) / (mu (1 - mu))`` with ``mu = sum_k p_k q_k``
        (Dr. MAS, arXiv 2602.08847, Prop. 4.3). ``shares @ result == 1`` (law of total variance).

    Raises:
        ValueError: mismatched lengths, shares not positive / not summing to 1, success outside [0, 1], or a
            pooled reward with zero variance.
    """
    p, q = _check_inputs(shares, success)
    mu = p @ q
    return (q * (1.0 - q) + (q - mu) ** 2) / (mu * (1.0 - mu))


def _agent_counts(p: np.ndarray, group_size: int) -> np.ndarray:
    counts = np.floor(p * group_size + 0.5).astype(np.int64)
    counts[np.argmax(counts)] += group_size - counts.sum()  # rounding remainder to the largest agent
    if np.any(counts < 2):
        raise ValueError(
            f"group_size={group_size} gives some agent fewer than 2 calls per group ({counts.tolist()}); "
            "agent-wise normalisation needs >= 2, so raise group_size"
        )
    return counts


def simulate(
    shares: Sequence[float],
    success: Sequence[float],
    *,
    n_groups: int = 50,
    group_size: int = 2000,
    calls_per_traj: int = 10,
    dim: int = 32,
    seed: int = 0,
    unbiased: bool = True,
    estimators: Sequence[str] = DEFAULT_ESTIMATORS,
) -> dict:
    """Empirical ``E_k[A^2]`` and ``mean ||g||^2 / d`` per agent for each estimator, beside the closed form.

    Args:
        shares, success: (K,) as in :func:`closed_form_factors`.
        n_groups: prompt groups (``uid``); B = ``n_groups * group_size`` calls in all.
        group_size: agent calls per prompt group (M); agent k gets ``round(p_k M)`` of them.
        calls_per_traj: calls per trajectory (``traj_uid``), must divide ``group_size``; only ``grpo`` uses it.
        dim: dimension d of the score vector ``z ~ N(0, I_d)`` in ``g = A z``.
        seed: seed of the numpy Generator (rewards, shuffles, z).
        unbiased: passed to the estimators (True: n - 1 std, the project default; False: population std).
        estimators: names from :data:`drmas_train.algorithm.advantages.ESTIMATORS`.

    Returns:
        JSON-ready dict: ``config``, ``closed_form`` (``global`` factors and ``drmas`` = 1), and per estimator
        ``factor`` (K,) mean A^2 per agent, ``grad_factor`` (K,) mean ||g||^2 / d per agent, ``weighted_sum``
        (sum_k p_k factor_k), ``rel_err_vs_closed_form`` (K,) for ``grpo_step`` only.

    Raises:
        ValueError: bad shares/success (see :func:`closed_form_factors`), non-positive sizes, ``calls_per_traj``
            not dividing ``group_size``, an agent with < 2 calls per group, or an unknown estimator name.
    """
    p, q = _check_inputs(shares, success)
    for name, v in (
        ("n_groups", n_groups),
        ("group_size", group_size),
        ("calls_per_traj", calls_per_traj),
        ("dim", dim),
    ):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if group_size % calls_per_traj:
        raise ValueError(f"calls_per_traj={calls_per_traj} must divide group_size={group_size}")
    fns = {name: get_estimator(name) for name in estimators}
    counts = _agent_counts(p, group_size)
    rng = np.random.default_rng(seed)

    base = np.repeat(np.arange(p.size), counts)  # (M,) agent of each call, stratified
    agent = np.concatenate([rng.permutation(base) for _ in range(n_groups)])  # (B,) shuffled per group
    n = agent.size
    uid = np.repeat(np.arange(n_groups), group_size)  # (B,)
    traj_uid = np.arange(n) // calls_per_traj  # (B,) consecutive calls form a trajectory
    turn = np.arange(n) % calls_per_traj  # (B,) unused by these estimators, passed for completeness
    reward = (rng.random(n) < q[agent]).astype(np.float64)  # (B,) Bernoulli(q_k)
    z_norm2 = np.zeros(n)  # (B,) ||z||^2, z ~ N(0, I_d), drawn in chunks to bound memory
    z_all = []
    for start in range(0, n, 65536):
        z = rng.standard_normal((min(65536, n - start), dim))  # (chunk, d)
        z_all.append(z)
        z_norm2[start : start + len(z)] = (z * z).sum(axis=1)

    out: dict = {
        "config": {
            "shares": p.tolist(),
            "success": q.tolist(),
            "calls_per_agent_per_group": counts.tolist(),
            "n_groups": n_groups,
            "group_size": group_size,
            "calls_per_traj": calls_per_traj,
            "dim": dim,
            "seed": seed,
            "unbiased_std": unbiased,
        },
        "closed_form": {"global": closed_form_factors(p, q).tolist(), "drmas": [1.0] * p.size},
        "estimators": {},
    }
    for name, fn in fns.items():
        adv = fn(reward, uid=uid, agent_id=agent, traj_uid=traj_uid, turn=turn, unbiased=unbiased)  # (B,)
        g_norm2 = np.empty(n)  # (B,) ||A z||^2, the per-call policy-gradient surrogate
        for i, start in enumerate(range(0, n, 65536)):
            g = adv[start : start + len(z_all[i]), None] * z_all[i]  # (chunk, d)
            g_norm2[start : start + len(g)] = (g * g).sum(axis=1)
        factor = np.array([np.mean(adv[agent == k] ** 2) for k in range(p.size)])
        grad = np.array([np.mean(g_norm2[agent == k]) / dim for k in range(p.size)])
        entry = {"factor": factor.tolist(), "grad_factor": grad.tolist(), "weighted_sum": float(p @ factor)}
        if name == "grpo_step":
            cf = np.asarray(out["closed_form"]["global"])
            entry["rel_err_vs_closed_form"] = (factor / cf - 1.0).tolist()
        out["estimators"][name] = entry
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run :func:`simulate` and print its JSON (also written to ``--out`` if given). Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shares", type=float, nargs="+", default=[0.9, 0.1], help="sample share per agent (sum 1)"
    )
    ap.add_argument(
        "--success", type=float, nargs="+", default=[0.9, 0.1], help="Bernoulli success rate per agent"
    )
    ap.add_argument("--groups", type=int, default=50, help="prompt groups (uid)")
    ap.add_argument("--group-size", type=int, default=2000, help="agent calls per prompt group")
    ap.add_argument("--calls-per-traj", type=int, default=10, help="calls per trajectory (used by grpo)")
    ap.add_argument("--dim", type=int, default=32, help="dimension d of z ~ N(0, I_d)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--population", action="store_true", help="population std (n) instead of unbiased (n - 1)"
    )
    ap.add_argument("--estimators", nargs="+", default=list(DEFAULT_ESTIMATORS))
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = simulate(
        args.shares,
        args.success,
        n_groups=args.groups,
        group_size=args.group_size,
        calls_per_traj=args.calls_per_traj,
        dim=args.dim,
        seed=args.seed,
        unbiased=not args.population,
        estimators=args.estimators,
    )
    res["wall_s"] = round(time.perf_counter() - t0, 3)
    text = json.dumps(res, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
