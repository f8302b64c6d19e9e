"""The LLM side of ``drmas eval``: per-agent models, lock-step batched rollouts, episode rows.

Tasks are played in batches of ``EvalConfig.batch_tasks`` tasks x ``k`` samples by
:func:`drmas_train.rollout.rollout`, which makes one batched generate call per model per step. Models come from
:func:`drmas_train.assignment.build_models`: ``EvalConfig.model`` is the default of every agent (key ``"*"``),
``EvalConfig.agent_models`` overrides it per agent; agents naming the same model share one backend.

Per-episode seeds: the rollout engine seeds env resets and sampling from its batch seed, recorded in each row
as ``seed`` (batch ``b`` of source ``s`` uses :func:`~drmas_train.evaluate.episode_seed` ``(seed, s, b, 0)``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["run_llm", "agent_model_mapping"]


def agent_model_mapping(config: Any) -> dict[str, Any]:
    """``{"*": model, **agent_models}`` (the default first, then the per-agent overrides)."""
    mapping: dict[str, Any] = {}
    if config.model:
        mapping["*"] = config.model
    mapping.update(config.agent_models)
    return mapping


def openai_pool(mapping: dict[str, Any], env_agents: list[str], base_url: str) -> Any:
    """A :class:`~drmas_train.assignment.ModelPool` of OpenAI-compatible clients, one per distinct model name.

    Nothing is loaded locally: each model name is the server's. Token ids are those the server returns (else empty).

    Raises:
        AssignmentError: an agent without a model, or a model for an agent the env lacks.
        ValueError: a model given as a dict of ModelSpec fields (only names make sense for a server).
    """
    from drmas_train.assignment import ModelPool, check_agents
    from drmas_train.backends.openai import OpenAIBackend

    if any(not isinstance(m, str) for m in mapping.values()):
        raise ValueError("backend 'openai' takes model names (the server's), not ModelSpec dicts")
    check_agents(mapping, env_agents)
    names = {a: mapping.get(a, mapping.get("*")) for a in env_agents}
    return ModelPool(
        models={}, backends={m: OpenAIBackend(base_url, m) for m in sorted(set(names.values()))}, agent_model_ids=names
    )


def _rows_of_batch(result: Any, envs: list[Any], *, run_id: str, env_id: str, seed: int, config: Any,
                   agent_model_ids: dict[str, str]) -> list[dict[str, Any]]:
    from drmas_train.evaluate import _qa_fields
    from drmas_train.results import episode_row

    by_traj: dict[str, list[Any]] = defaultdict(list)
    for s in result.samples:
        by_traj[s.traj_uid].append(s)
    if len(envs) != len(result.trajectories):
        raise RuntimeError(f"rollout made {len(envs)} envs but returned {len(result.trajectories)} trajectories")
    rows = []
    for env, traj in zip(envs, result.trajectories, strict=True):
        raw = getattr(env, "unwrapped", env)
        agents = list(raw.possible_agents)
        calls = by_traj[traj.traj_uid]
        tok_in: dict[str, int] = dict.fromkeys(agents, 0)
        tok_out: dict[str, int] = dict.fromkeys(agents, 0)
        for s in calls:
            tok_in[s.agent_id] += len(s.prompt_ids)
            tok_out[s.agent_id] += len(s.response_ids)
        final = next((raw.infos[a] for a in raw.possible_agents if "score" in raw.infos.get(a, {})), {})
        row = episode_row(
            run_id=run_id,
            env_id=env_id,
            data_source=traj.data_source,
            task_id=traj.task_id,
            sample_index=int(traj.traj_uid.rsplit("/", 1)[1]),
            seed=seed,
            policy="llm",
            agent_models={a: agent_model_ids.get(a, "") for a in agents},
            num_turns=traj.num_turns,
            reward=float(traj.score),
            won=bool(traj.won),
            returns=dict(traj.episode_returns),
            calls={a: traj.calls.get(a, 0) for a in agents},
            invalid_actions={a: traj.invalid_calls.get(a, 0) for a in agents},
            tokens_in=tok_in,
            tokens_out=tok_out,
            wall_time_s=float(traj.wall_time_s),
            truncated=bool(traj.truncated),
            finish_reasons=[s.finish_reason for s in calls],
            **_qa_fields(final),
        )
        if config.transcripts:
            row["transcript"] = [
                {"agent": s.agent_id, "text": s.response_text, "valid": s.is_action_valid} for s in calls
            ]
        rows.append(row)
    return rows


def run_llm(config: Any, run_id: str, progress: bool) -> list[dict[str, Any]]:
    """Evaluate LLM agents as described by ``config`` (an :class:`~drmas_train.evaluate.EvalConfig`).

    Returns:
        episode rows of the result schema, ordered by env, source, task, sample.

    Raises:
        AssignmentError: an agent without a model, or a model for an agent the env lacks (before loading).
        ModelNotFoundError: a model that cannot be resolved offline.
    """
    from drmas_train.assignment import build_models
    from drmas_train.backends.base import SamplingParams
    from drmas_train.evaluate import _make_env, _progress, _sources, episode_seed
    from drmas_train.rollout import rollout

    sampling = SamplingParams(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_new_tokens=config.max_new_tokens,
    )
    mapping = agent_model_mapping(config)
    sources = _sources(config)
    plan = []
    for env_id in config.envs:
        for s_idx, source in enumerate(sources):
            probe = _make_env(env_id, source, config.env_kwargs)
            raw = getattr(probe, "unwrapped", probe)
            tasks = raw.tasks  # load the (default) source once; every env of the run shares it
            n = len(tasks) if config.limit is None else min(len(tasks), config.limit)
            plan.append((env_id, s_idx, tasks, n, list(raw.possible_agents)))
            probe.close()
    pools: dict[tuple[str, ...], Any] = {}
    made_envs: list[Any] = []  # envs of the current batch, in the order rollout creates them (= trajectory order)
    rows: list[dict[str, Any]] = []
    total = sum(p[3] for p in plan) * config.k
    with _progress(total, progress, f"eval {config.display_label()}") as bar:
        for env_id, s_idx, tasks, n_tasks, agents in plan:
            key = tuple(agents)
            if key not in pools:
                pools[key] = (
                    openai_pool(mapping, agents, config.base_url)
                    if config.backend == "openai"
                    else build_models(mapping, env_agents=agents, backend=config.backend)
                )
            pool = pools[key]

            def env_fn(env_id=env_id, tasks=tasks):
                env = _make_env(env_id, tasks, config.env_kwargs)
                made_envs.append(env)
                return env

            for b, start in enumerate(range(0, n_tasks, config.batch_tasks)):
                batch = [tasks[i] for i in range(start, min(start + config.batch_tasks, n_tasks))]
                seed = episode_seed(config.seed, s_idx, b, 0)
                made_envs.clear()
                result = rollout(
                    env_fn,
                    batch,
                    config.k,
                    pool,
                    sampling,
                    seed=seed,
                    max_prompt_tokens=config.max_prompt_tokens,
                    truncation=config.truncation,
                    progress=False,
                )
                rows += _rows_of_batch(
                    result, made_envs, run_id=run_id, env_id=env_id, seed=seed, config=config,
                    agent_model_ids=dict(pool.agent_model_ids),
                )
                for env in made_envs:
                    env.close()
                bar.update(len(batch) * config.k)
    return rows
