"""Evaluation: play a policy on env ids x task sources, k samples per task, and write a results directory.

Policies: a scripted baseline (:mod:`drmas_train.baselines`: ``oracle``, ``random``, ``no-search``), played
one episode at a time; or ``llm``: LLM agents with a per-agent model assignment (:mod:`drmas_train.models`),
played in lock-step batches by the rollout engine (:func:`drmas_train.rollout.rollout`).

Seeds are fixed: episode ``(source s, task i, sample j)`` of a run with ``seed`` uses
``SeedSequence([seed, s, i, j])`` (:func:`episode_seed`) for the env and the scripted policy; LLM sampling
uses the rollout engine's seeding from ``seed``. The reference's validation defaults are temperature 0.6,
top-p 0.95, k = 16 (:class:`EvalConfig`).

Output: :func:`drmas_train.results.write_run` (``summary.json`` + ``episodes.jsonl``, docs/results-schema.md).
"""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.metrics import default_k_values, summarize_episodes
from drmas_train.results import (
    RunResult,
    config_hash,
    env_version,
    episode_row,
    git_commit,
    load_run,
    write_run,
)

__all__ = ["EvalConfig", "episode_seed", "play_scripted", "evaluate", "build_summary", "QA_INFO_KEYS"]

#: Where per-episode EM / F1 / number of searches are read from the env's final infos (first key present).
QA_INFO_KEYS: dict[str, tuple[str, ...]] = {
    "em": ("em", "exact_match"),
    "f1": ("f1", "token_f1"),
    "num_searches": ("num_searches", "searches"),
}

#: Policies that need no model.
SCRIPTED = ("oracle", "random", "no-search")


@dataclasses.dataclass
class EvalConfig:
    """What to evaluate and how (saved, with its hash, in every ``summary.json``).

    Attributes:
        envs: env ids (``name-vN``), e.g. ``("math-solver-verifier-v0",)``.
        data: task specs for :func:`drmas_envs.data.load_tasks` (file paths, ``reasoning_gym:<name>``,
            ``hf:<id>``); empty = each env's own default tasks.
        limit: evaluate only the first ``limit`` tasks of each source (None = all).
        k: samples per task (>= 1); pass@k is reported for powers of two up to k, and k.
        policy: ``"oracle"``, ``"random"``, ``"no-search"`` or ``"llm"``.
        model: the model every agent uses (``llm``), e.g. ``"smollm2-135m-instruct"``.
        agent_models: per-agent overrides ``{agent_id: model}`` (``llm``); a model is a name/path or a dict of
            :class:`~drmas_train.models.ModelSpec` fields (e.g. ``{"name_or_path": "tiny-qwen3", "seed": 1,
            "model_id": "tiny-b"}`` for a second, separate copy).
        backend: LLM backend: ``"hf"`` or ``"vllm"`` (local models, :func:`~drmas_train.assignment.build_models`)
            or ``"openai"`` (an OpenAI-compatible server at ``base_url``; model names are the server's).
        base_url: the server's base URL (``"openai"`` only), e.g. ``"http://127.0.0.1:8000/v1"``.
        temperature, top_p, top_k, max_new_tokens: sampling (reference validation: 0.6, 0.95, off).
        max_prompt_tokens, truncation: prompt limit and how to cut (``"left"``, ``"middle"``, ``"error"``).
        seed: base seed (see the module docstring).
        batch_tasks: tasks per lock-step rollout batch (``llm``; each task is played k times).
        env_kwargs: extra keyword arguments for ``make(env_id, ...)``.
        label: display name on leaderboards (default: the policy, or the models).
        transcripts: store every call's text in the episode rows.
    """

    envs: Sequence[str]
    data: Sequence[str] = ()
    limit: int | None = None
    k: int = 16
    policy: str = "oracle"
    model: str | None = None
    agent_models: dict[str, Any] = dataclasses.field(default_factory=dict)
    backend: str = "hf"
    base_url: str | None = None
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = -1
    max_new_tokens: int = 1024
    max_prompt_tokens: int | None = None
    truncation: str = "left"
    seed: int = 0
    batch_tasks: int = 8
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    label: str | None = None
    transcripts: bool = False

    def __post_init__(self) -> None:
        self.envs = tuple(self.envs)
        self.data = tuple(str(d) for d in self.data)
        if not self.envs:
            raise ValueError("EvalConfig.envs is empty: give at least one env id, e.g. 'math-solver-verifier-v0'")
        for env_id in self.envs:
            env_version(env_id)
        for name in ("k", "batch_tasks", "max_new_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"EvalConfig.{name} must be an int >= 1, got {v!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"EvalConfig.limit must be None or an int >= 1, got {self.limit!r}")
        if self.policy not in (*SCRIPTED, "llm"):
            raise ValueError(f"unknown policy {self.policy!r}; accepted: {[*SCRIPTED, 'llm']}")
        if self.policy == "llm" and not self.model and not self.agent_models:
            raise ValueError("policy 'llm' needs a model: give model (every agent) and/or agent_models")
        if self.backend not in ("hf", "vllm", "openai"):
            raise ValueError(f"unknown backend {self.backend!r}; accepted: 'hf', 'vllm', 'openai'")
        if (self.backend == "openai") != (self.base_url is not None):
            raise ValueError("base_url goes with backend 'openai' and only with it (the server's URL, e.g. http://127.0.0.1:8000/v1)")
        if self.backend == "openai" and self.max_prompt_tokens is not None:
            raise ValueError("max_prompt_tokens cannot be used with backend 'openai': the server applies the chat template")
        if self.policy != "llm" and (self.model or self.agent_models):
            raise ValueError(f"policy {self.policy!r} is scripted; model/agent_models apply only to policy 'llm'")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists for tuples)."""
        d = dataclasses.asdict(self)
        d["envs"], d["data"] = list(self.envs), list(self.data)
        return d

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling parameters as recorded in the summary."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
        }

    def display_label(self) -> str:
        """``label``, else the policy, else the model (and per-agent overrides)."""
        if self.label:
            return self.label
        if self.policy != "llm":
            return self.policy
        parts = [str(self.model)] if self.model else []
        for agent, m in sorted(self.agent_models.items()):
            name = m.get("model_id") or m.get("name_or_path") if isinstance(m, dict) else m
            parts.append(f"{agent}={name}")
        return ", ".join(parts)


def episode_seed(seed: int, source_index: int, task_index: int, sample_index: int) -> int:
    """The fixed 31-bit seed of one episode: ``SeedSequence([seed, source, task, sample])``'s first word."""
    return int(np.random.SeedSequence([seed, source_index, task_index, sample_index]).generate_state(1)[0] >> 1)


def _make_env(env_id: str, source: Any | None, env_kwargs: dict[str, Any]) -> Any:
    import inspect

    from drmas_envs import make, spec

    kwargs = dict(env_kwargs)
    if source is not None:
        params = inspect.signature(spec(env_id).load()).parameters
        key = next((k for k in ("data", "tasks") if k in params), None)
        if key is None:
            raise ValueError(f"env {env_id!r} takes no 'data' or 'tasks' argument, so it cannot evaluate --data")
        kwargs[key] = source
    return make(env_id, **kwargs)


def _qa_fields(info: dict[str, Any]) -> dict[str, float]:
    out = {}
    for field, keys in QA_INFO_KEYS.items():
        for key in keys:
            if isinstance(info.get(key), (int, float)) and not isinstance(info.get(key), bool):
                out[field] = float(info[key])
                break
    return out


def play_scripted(
    env: Any, policy: Callable[[Any, str, random.Random], str], task_index: int, seed: int, *, max_calls: int = 1000
) -> dict[str, Any]:
    """Play one episode of ``env`` on task ``task_index`` with a scripted ``policy``.

    Returns:
        the episode's fields of the result schema (without run/env/sample ids): ``data_source``, ``task_id``,
        ``num_turns``, ``reward`` (episode score), ``won``, ``returns``, ``calls``, ``invalid_actions``,
        ``tokens_in``/``tokens_out`` (zeros: no tokenizer), ``wall_time_s``, QA fields, ``transcript``.

    Raises:
        RuntimeError: the episode did not end within ``max_calls`` agent calls.
    """
    t0 = time.perf_counter()
    env.reset(seed=seed, options={"task_index": task_index})
    raw = getattr(env, "unwrapped", env)
    rng = random.Random(seed)
    final: dict[str, Any] | None = None
    for n_iter, agent in enumerate(env.agent_iter()):
        if n_iter > 2 * max_calls + 10:
            raise RuntimeError(f"episode did not end within {max_calls} calls (task_index={task_index}, seed={seed})")
        _, _, term, trunc, _ = env.last()
        if term or trunc:
            env.step(None)
            continue
        env.step(policy(raw, agent, rng))
        if final is None and all(env.terminations[a] or env.truncations[a] for a in env.agents):
            final = dict(env.infos[agent])
    if final is None:
        raise RuntimeError(f"episode ended without a final info (task_index={task_index}); is the env a drmas env?")
    calls = Counter(r.agent for r in raw.history)
    invalid = Counter(r.agent for r in raw.history if not r.valid)
    agents = list(raw.possible_agents)
    return {
        "data_source": raw.task.data_source,
        "task_id": raw.task.task_id,
        "num_turns": int(raw.num_turns),
        "reward": float(final["score"]),
        "won": bool(final["won"]),
        "returns": {a: float(v) for a, v in raw.episode_returns.items()},
        "calls": {a: calls[a] for a in agents},
        "invalid_actions": {a: invalid[a] for a in agents},
        "tokens_in": dict.fromkeys(agents, 0),
        "tokens_out": dict.fromkeys(agents, 0),
        "wall_time_s": time.perf_counter() - t0,
        **_qa_fields(final),
        "transcript": [{"agent": r.agent, "text": r.text, "valid": r.valid} for r in raw.history],
    }


def _sources(config: EvalConfig) -> list[Any | None]:
    if not config.data:
        return [None]
    from drmas_envs.data import load_tasks

    return [load_tasks(spec, limit=config.limit) for spec in config.data]


def _progress(total: int, enabled: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, disable=not enabled, desc=desc, unit="ep", dynamic_ncols=True)


def _run_scripted(config: EvalConfig, run_id: str, progress: bool) -> list[dict[str, Any]]:
    from drmas_train.baselines import get_baseline

    policy = get_baseline(config.policy)
    rows: list[dict[str, Any]] = []
    sources = _sources(config)
    plan = []
    for env_id in config.envs:
        for s_idx, source in enumerate(sources):
            env = _make_env(env_id, source, config.env_kwargs)
            n = len(getattr(env, "unwrapped", env).tasks)
            plan.append((env_id, s_idx, env, n if config.limit is None else min(n, config.limit)))
    total = sum(n for *_, n in plan) * config.k
    with _progress(total, progress, f"eval {config.display_label()}") as bar:
        for env_id, s_idx, env, n_tasks in plan:
            agents = list(getattr(env, "unwrapped", env).possible_agents)
            for t_idx in range(n_tasks):
                for j in range(config.k):
                    seed = episode_seed(config.seed, s_idx, t_idx, j)
                    ep = play_scripted(env, policy, t_idx, seed)
                    if not config.transcripts:
                        ep.pop("transcript")
                    rows.append(
                        episode_row(
                            run_id=run_id,
                            env_id=env_id,
                            sample_index=j,
                            seed=seed,
                            policy=config.policy,
                            agent_models=dict.fromkeys(agents, config.policy),
                            **ep,
                        )
                    )
                    bar.update(1)
            env.close()
    return rows


def build_summary(config: EvalConfig, rows: list[dict[str, Any]], *, run_id: str, wall_time_s: float) -> dict[str, Any]:
    """The ``summary.json`` object of a run: metadata, config and its hash, and the metrics table."""
    try:
        from drmas_train import __version__
    except ImportError:  # an editable install made before drmas_train/__init__.py existed maps it as a namespace
        from importlib.metadata import version

        __version__ = version("drmas")
    agent_models: dict[str, str] = {}
    for row in rows:
        agent_models.update(row["agent_models"])
    cfg = config.to_dict()
    return {
        "run_id": run_id,
        "label": config.display_label(),
        "drmas_version": __version__,
        "git_commit": git_commit(),
        "config": cfg,
        "config_hash": config_hash(cfg),
        "policy": config.policy,
        "agent_models": agent_models,
        "envs": [{"env_id": e, "version": env_version(e)} for e in config.envs],
        "data": list(config.data),
        "k": config.k,
        "sampling": config.sampling,
        "seed": config.seed,
        "num_episodes": len(rows),
        "wall_time_s": wall_time_s,
        "metrics": summarize_episodes(rows, default_k_values(config.k)),
    }


def evaluate(config: EvalConfig, out_dir: str | Path, *, progress: bool = True) -> RunResult:
    """Run the evaluation described by ``config`` and write it to ``out_dir`` (which must not hold a run).

    Returns:
        the written run, loaded back (so the schema is checked).

    Raises:
        ValueError / ResultsError: a bad config or an existing run in ``out_dir``; env/model/data errors from
        the libraries they come from.
    """
    out = Path(out_dir)
    if (out / "summary.json").exists():
        from drmas_train.results import ResultsError

        raise ResultsError(f"{out} already holds a run (summary.json exists); choose a new --out directory")
    run_id = uuid.uuid4().hex[:12]
    t0 = time.perf_counter()
    if config.policy == "llm":
        from drmas_train.llm_eval import run_llm

        rows = run_llm(config, run_id, progress)
    else:
        rows = _run_scripted(config, run_id, progress)
    wall = time.perf_counter() - t0
    summary = build_summary(config, rows, run_id=run_id, wall_time_s=wall)
    write_run(out, summary, rows)
    return load_run(out)
