"""Evaluation metrics: avg@k, unbiased pass@k, the reference's "any of k", standard errors, per-source tables.

Everything here is a pure function of plain numbers or of episode rows (dicts in the result schema,
:mod:`drmas_train.eval.results`); nothing imports torch or an env.

Definitions (per task ``i`` with ``n_i`` samples of which ``c_i`` are correct, ``N`` tasks):

* **avg@k** = mean over tasks of ``c_i / n_i`` (with ``n_i == k``): the expected accuracy of one sample.
* **pass@k** (unbiased, Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv 2107.03374,
  Sec. 2.1): ``1 - C(n-c, k) / C(n, k)`` per task, averaged over tasks. Computed in the numerically stable
  product form of the paper's Figure 3: ``1 - prod_{j=n-c+1}^{n} (1 - k / j)``. Defined only when every task
  has ``n >= k``.
* **any-of-k** (what the Dr. MAS / verl-agent reference reports as pass@k): 1 if any of the *first* ``k``
  samples is correct. It equals unbiased pass@k exactly when ``n == k``; with ``n > k`` it depends on sample
  order and has higher variance.
* **standard error** of a mean over tasks: ``std(values, ddof=1) / sqrt(N)`` (None when ``N < 2``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "Estimate",
    "mean_stderr",
    "pass_at_k",
    "pass_at_k_tasks",
    "any_of_k",
    "avg_at_k",
    "group_correct",
    "summarize_episodes",
    "per_agent_stats",
]

#: Optional per-episode numeric fields averaged when present (search envs: exact match, token F1, searches).
QA_FIELDS: tuple[str, ...] = ("em", "f1", "num_searches")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean over tasks with its standard error.

    Attributes:
        value: the mean.
        stderr: standard error of the mean (sample std with ddof=1 over sqrt(n)); None when n < 2.
        n: number of values (tasks) averaged.
    """

    value: float
    stderr: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready ``{"value", "stderr", "n"}``."""
        return {"value": self.value, "stderr": self.stderr, "n": self.n}

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> Estimate:
        """Inverse of :meth:`to_dict`."""
        return cls(float(row["value"]), None if row.get("stderr") is None else float(row["stderr"]), int(row["n"]))


def mean_stderr(values: Iterable[float]) -> Estimate:
    """Mean and standard error of the mean of ``values``.

    Raises:
        ValueError: if ``values`` is empty or holds a non-finite number.
    """
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("cannot average an empty list of values: give at least one task")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"values must be finite numbers, got {[x for x in xs if not math.isfinite(x)][:3]}")
    n = len(xs)
    mean = math.fsum(xs) / n
    if n < 2:
        return Estimate(mean, None, n)
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1)
    return Estimate(mean, math.sqrt(var / n), n)


def _check_counts(n: int, c: int, k: int) -> None:
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"pass@k: {name} must be an int, got {type(v).__name__} {v!r}")
    if k < 1:
        raise ValueError(f"pass@k: k must be >= 1, got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: need 0 <= c <= n (correct samples among n), got n={n}, c={c}")
    if n < k:
        raise ValueError(
            f"pass@k is undefined for n={n} samples < k={k}: the unbiased estimator needs n >= k samples per task"
        )


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task: the probability that a random k-subset of the n samples holds a correct one.

    ``1 - C(n-c, k) / C(n, k)``, evaluated as ``1 - prod_{j=n-c+1}^{n} (1 - k/j)`` (Chen et al. 2021,
    arXiv 2107.03374, Figure 3), which never forms a large binomial coefficient.

    Args:
        n: samples drawn for the task (>= k).
        c: how many of them are correct (0 <= c <= n).
        k: the budget (>= 1).

    Raises:
        TypeError: a non-int argument. ValueError: ``k < 1``, ``c`` outside ``[0, n]`` or ``n < k``.
    """
    _check_counts(n, c, k)
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    prod = 1.0
    for j in range(n - c + 1, n + 1):
        prod *= 1.0 - k / j
    return 1.0 - prod


def pass_at_k_tasks(counts: Sequence[tuple[int, int]], k: int) -> Estimate:
    """Mean unbiased pass@k over tasks, with its standard error.

    Args:
        counts: one ``(n, c)`` pair per task.
        k: the budget; every task must have ``n >= k``.

    Raises:
        ValueError: empty ``counts``, or a task with ``n < k`` (names the task index).
    """
    if not counts:
        raise ValueError("pass@k over tasks: no tasks given")
    values = []
    for i, (n, c) in enumerate(counts):
        if n < k:
            raise ValueError(f"pass@{k} is undefined: task #{i} has only n={n} samples; every task needs n >= k")
        values.append(pass_at_k(n, c, k))
    return mean_stderr(values)


def any_of_k(correct: Sequence[Sequence[bool]], k: int) -> Estimate:
    """The reference's pass@k: per task, 1 if any of its *first* ``k`` samples is correct; mean over tasks.

    Equal to :func:`pass_at_k_tasks` when every task has exactly ``k`` samples; with more samples it
    depends on their order (it ignores samples ``k..n-1``), which is why drmas reports the unbiased one.

    Raises:
        ValueError: ``k < 1``, no tasks, or a task with fewer than ``k`` samples.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"any-of-k: k must be an int >= 1, got {k!r}")
    if not correct:
        raise ValueError("any-of-k: no tasks given")
    values = []
    for i, flags in enumerate(correct):
        if len(flags) < k:
            raise ValueError(f"any-of-{k}: task #{i} has only {len(flags)} samples; every task needs >= k")
        values.append(1.0 if any(bool(f) for f in list(flags)[:k]) else 0.0)
    return mean_stderr(values)


def avg_at_k(correct: Sequence[Sequence[bool | float]]) -> Estimate:
    """avg@k: mean over tasks of the per-task mean score (``c/k`` for 0/1 correctness).

    Args:
        correct: per task, its k sample outcomes (bools or scores in [0, 1]).

    Raises:
        ValueError: no tasks, or a task without samples.
    """
    if not correct:
        raise ValueError("avg@k: no tasks given")
    values = []
    for i, flags in enumerate(correct):
        if len(flags) == 0:
            raise ValueError(f"avg@k: task #{i} has no samples")
        values.append(math.fsum(float(f) for f in flags) / len(flags))
    return mean_stderr(values)


def group_correct(episodes: Iterable[Mapping[str, Any]], field: str = "won") -> dict[str, list[bool]]:
    """Group episode rows by ``task_id`` (in first-seen order) into lists of ``field``, ordered by ``sample_index``.

    Raises:
        ValueError: a row missing ``task_id`` or ``field``, or two rows with the same (task_id, sample_index).
    """
    grouped: dict[str, dict[int, Any]] = {}
    for row in episodes:
        if "task_id" not in row or field not in row:
            raise ValueError(f"episode row needs 'task_id' and {field!r}; got keys {sorted(row)}")
        per_task = grouped.setdefault(str(row["task_id"]), {})
        idx = int(row.get("sample_index", len(per_task)))
        if idx in per_task:
            raise ValueError(f"duplicate episode: task_id={row['task_id']!r} sample_index={idx}")
        per_task[idx] = row[field]
    return {tid: [per_task[i] for i in sorted(per_task)] for tid, per_task in grouped.items()}


def per_agent_stats(episodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per agent: valid-action rate (valid calls / calls), calls, and mean prompt/response tokens per episode.

    Reads each row's ``calls``, ``invalid_actions``, ``tokens_in`` and ``tokens_out`` dicts (agent -> int;
    missing dicts count as zero). Returns ``{agent: {"valid_action_rate", "calls", "tokens_in", "tokens_out"}}``
    where ``calls``/``tokens_*`` are means per episode; ``valid_action_rate`` is None for an agent never called.
    """
    calls: dict[str, int] = defaultdict(int)
    invalid: dict[str, int] = defaultdict(int)
    tok_in: dict[str, int] = defaultdict(int)
    tok_out: dict[str, int] = defaultdict(int)
    n_episodes = 0
    for row in episodes:
        n_episodes += 1
        for agent, v in (row.get("calls") or {}).items():
            calls[agent] += int(v)
        for agent, v in (row.get("invalid_actions") or {}).items():
            invalid[agent] += int(v)
        for agent, v in (row.get("tokens_in") or {}).items():
            tok_in[agent] += int(v)
        for agent, v in (row.get("tokens_out") or {}).items():
            tok_out[agent] += int(v)
    agents = sorted(set(calls) | set(invalid) | set(tok_in) | set(tok_out))
    out = {}
    for a in agents:
        out[a] = {
            "valid_action_rate": 1.0 - invalid[a] / calls[a] if calls[a] else None,
            "calls": calls[a] / max(n_episodes, 1),
            "tokens_in": tok_in[a] / max(n_episodes, 1),
            "tokens_out": tok_out[a] / max(n_episodes, 1),
        }
    return out


def _summarize_group(rows: list[Mapping[str, Any]], k_values: Sequence[int]) -> dict[str, Any]:
    won = group_correct(rows, "won")
    sizes = sorted({len(v) for v in won.values()})
    counts = [(len(v), sum(bool(x) for x in v)) for v in won.values()]
    out: dict[str, Any] = {
        "num_tasks": len(won),
        "num_episodes": len(rows),
        "samples_per_task": sizes[0] if len(sizes) == 1 else sizes,
        "avg@k": avg_at_k(list(won.values())).to_dict(),
        "reward": avg_at_k(list(group_correct(rows, "reward").values())).to_dict(),
        "pass@k": {},
        "any_of_k": {},
    }
    n_min = min(n for n, _ in counts)
    for k in k_values:
        if k <= n_min:
            out["pass@k"][str(k)] = pass_at_k_tasks(counts, k).to_dict()
            out["any_of_k"][str(k)] = any_of_k(list(won.values()), k).to_dict()
    for field in QA_FIELDS:
        if all(row.get(field) is not None for row in rows):
            out[field] = avg_at_k(list(group_correct(rows, field).values())).to_dict()
    out["agents"] = per_agent_stats(rows)
    if all(row.get("agent_rewards") for row in rows):  # games: per-role return and win/draw/loss rates
        from drmas_envs.core.role_stats import role_outcomes  # here: other results never import drmas_envs

        roles = role_outcomes((row["agent_rewards"], row.get("learners")) for row in rows)
        out["roles"] = {role: stats.to_dict() for role, stats in roles.items()}
    turns = [float(row.get("num_turns", 0)) for row in rows]
    out["num_turns"] = mean_stderr(turns).to_dict()
    return out


def default_k_values(n: int) -> list[int]:
    """Powers of two up to ``n``, plus ``n`` itself: the k's reported for pass@k (e.g. 16 -> [1, 2, 4, 8, 16])."""
    ks = [1]
    while ks[-1] * 2 <= n:
        ks.append(ks[-1] * 2)
    if ks[-1] != n:
        ks.append(n)
    return ks


def summarize_episodes(
    episodes: Sequence[Mapping[str, Any]], k_values: Sequence[int] | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """The metrics table of a run: per env id, per ``data_source`` and ``"overall"``.

    Each cell holds ``avg@k``, ``reward`` (mean episode score), ``pass@k`` and ``any_of_k`` for each k in
    ``k_values`` not exceeding the smallest per-task sample count (default :func:`default_k_values`),
    EM/F1/number of searches where every row has them, ``num_turns``, per-agent
    ``valid_action_rate``/``calls``/``tokens_in``/``tokens_out``, and for games (every row has ``agent_rewards``)
    ``roles``: per role, mean return and win/draw/loss rates with standard errors over episodes
    (:func:`drmas_envs.core.role_stats.role_outcomes`); estimates are ``{"value", "stderr", "n"}``
    with n = number of tasks. "overall" pools all tasks of the env (a task is (data_source, task_id)).

    Raises:
        ValueError: no episodes, or rows missing ``env_id``/``data_source``/``task_id``/``won``/``reward``.
    """
    if not episodes:
        raise ValueError("no episodes to summarize")
    by_env: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in episodes:
        missing = [f for f in ("env_id", "data_source", "task_id", "won", "reward") if f not in row]
        if missing:
            raise ValueError(f"episode row is missing {missing}; got keys {sorted(row)}")
        by_env[str(row["env_id"])].append(row)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    for env_id, rows in by_env.items():
        by_source: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
        for row in rows:
            by_source[str(row["data_source"])].append(row)
        n_max = max(len(v) for src in by_source.values() for v in group_correct(src).values())
        ks = list(k_values) if k_values is not None else default_k_values(n_max)
        env_table = {src: _summarize_group(src_rows, ks) for src, src_rows in sorted(by_source.items())}
        # Overall: tasks are keyed by (data_source, task_id) so equal ids in two sources stay distinct.
        pooled = [{**row, "task_id": f"{row['data_source']}/{row['task_id']}"} for row in rows]
        env_table["overall"] = _summarize_group(pooled, ks)
        table[env_id] = env_table
    return table
