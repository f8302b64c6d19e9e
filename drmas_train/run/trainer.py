"""The training loop: sample tasks -> rollout -> advantages -> PPO update per model -> metrics -> eval -> checkpoint.

:func:`train` only orchestrates; each step is one call into the module named after it (``rollout``,
``advantages``, ``update``, ``metrics_log``, ``checkpoint``). :func:`build_run` does all the setup, validating the
config against the env *before* any model is loaded. ``run.mode: sync`` (default) runs :func:`_train_sync`;
``run.mode: async`` runs :func:`_train_async` (docs/async.md), which shares its learning and bookkeeping steps
(:func:`_learn`, :func:`_end_iteration`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drmas_train.run.config import ConfigError, TrainConfig, to_yaml, validate_config
from drmas_train.run.metrics_log import batch_metrics
from drmas_train.run.policy_versions import PolicyVersions, staleness_metrics

__all__ = ["RunState", "build_run", "train", "compute_advantages", "model_specs"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RunState:
    """Everything a run holds between iterations (built by :func:`build_run`)."""

    cfg: TrainConfig
    run_dir: Path
    env_fn: Any  # () -> fresh env
    tasks: Any  # training TaskSource
    val_tasks: Any  # validation TaskSource or None
    pool: Any  # ModelPool
    optimizers: dict[str, Any]  # model_id -> ModelOptimizer (trainable models only)
    ref_models: dict[str, Any]  # model_id -> frozen reference (only when kl_coef > 0 or reward_kl_coef > 0)
    sampler: Any  # TaskSampler
    logger: Any  # MetricsLogger
    start_iteration: int = 0
    updater: Any = None  # LocalUpdater (default) or distributed RayUpdater (run/updater.py lists the seam)
    elapsed_before: float = 0.0  # seconds the earlier processes of this run spent (from the checkpoint resumed)
    kl_control: Any = None  # the KL-in-reward coefficient's controller (algorithm.reward_kl_coef > 0), else None
    versions: Any = None  # PolicyVersions: each trained model's update count (drmas_train.run.policy_versions)
    async_snapshot: Any = None  # run.mode async: the loop's state at the end of the last step, for checkpoints
    env_step: str = "round"  # the env's metadata["reference_env_step"] (GiGPO's discounted step returns)
    game_envs: dict[str, Any] = dataclasses.field(default_factory=dict)  # games: validation name -> env factory
    started: float = dataclasses.field(default_factory=time.perf_counter)  # this process's start
    stalled_warned: set[str] = dataclasses.field(default_factory=set)  # models already warned of a stalled update

    def elapsed(self) -> float:
        """Wall-clock seconds of the whole run so far: earlier processes (up to the checkpoint resumed) + this one."""
        return self.elapsed_before + time.perf_counter() - self.started


def _peft_lora(lora: Any) -> dict[str, Any] | None:
    """PEFT ``LoraConfig`` keyword arguments of a ``models.<key>.lora`` (or adapter) section."""
    if lora is None:
        return None
    return {"r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": list(lora.target_modules)}


def model_specs(cfg: TrainConfig) -> dict[str, Any]:
    """``agent_id -> ModelSpec`` for :func:`drmas_train.backends.factory.build_models`; the config key is the model id,
    so agents naming the same key share one model and different keys never do. An agent naming ``<key>:<adapter>``
    gets that LoRA adapter of the key's base (model id ``<key>:<adapter>``; the base is loaded once for all its
    adapters). A model of a dtype below float32 gets float32 master weights (``optim.master_dtype: float32``;
    :meth:`~drmas_train.model.models.ModelSpec.holds_masters` says which models keep them)."""
    from drmas_train.model.adapters import split_model_id
    from drmas_train.model.models import ModelSpec

    specs = {}
    for agent, name in cfg.agents.items():
        key, adapter = split_model_id(name)
        m = cfg.models[key]
        lora = _peft_lora(m.adapters[adapter] if adapter is not None else m.lora)
        overrides = {k: v for k, v in (("lr", m.lr), ("weight_decay", m.weight_decay)) if v is not None}
        master = "float32" if cfg.optim.master_dtype == "float32" and m.dtype != "float32" else None
        specs[agent] = ModelSpec(
            m.name_or_path, dtype=m.dtype, device=m.device, trainable=m.trainable, lora=lora, optimizer=overrides,
            seed=cfg.seed, chat_template_kwargs=dict(m.chat_template_kwargs), model_id=name, adapter=adapter,
            master_dtype=master,
        )  # fmt: skip
    return specs


def backend_factory(cfg: TrainConfig) -> Any:
    """``loaded -> backend``: each model's engine (``models.<key>.backend``) seeded with the run's seed; the HF engine
    decodes float32 models in ``rollout.autocast``'s dtype."""
    from drmas_train.backends.factory import make_backend
    from drmas_train.model.adapters import split_model_id

    def make(loaded: Any) -> Any:
        kind = cfg.models[split_model_id(loaded.model_id)[0]].backend
        return make_backend(loaded, kind, seed=cfg.seed, **({"autocast": cfg.rollout.autocast} if kind == "hf" else {}))

    return make


def build_run(cfg: TrainConfig, *, resume: bool = False, loader: Any = None, overwrite: bool = False) -> RunState:
    """Seed, load tasks, check the config against the env, load models, build optimizers, restore a checkpoint.

    ``loader`` (``(ModelSpec, model_id) -> LoadedModel``, default :func:`drmas_train.model.models.load_model`) lets
    tests and embedding code supply their own models. ``overwrite``: delete the results of an earlier run in
    ``run.dir`` instead of refusing it (:mod:`drmas_train.run.run_dir`).

    Nothing is written to ``run.dir`` until everything is validated and the models are loaded: a refused or failed
    start changes nothing on disk (:mod:`drmas_train.run.run_dir`: planned first, applied after the models load).

    Raises:
        ConfigError: raised before any model loads: ``run.dir`` holds an earlier run (without ``resume`` or
            ``overwrite``), ``resume`` without a checkpoint in ``run.dir``, a prepared task file named by the config
            is missing, ``env.data`` / ``env.id`` / ``env.kwargs`` the env cannot take, or env agents that do not
            match ``cfg.agents``; and, while loading, a model name or path that does not resolve
            (``models.<key>.name_or_path``).
        RunFinished: ``resume`` of a run whose latest checkpoint reached ``run.iterations`` (nothing loaded or written).
    """
    import drmas_envs
    from drmas_train.algorithm.advantages import needs_critic
    from drmas_train.algorithm.critic import build_critic, critic_keys, critic_models
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.algorithm.reward_shaping import make_kl_controller
    from drmas_train.algorithm.settings import UpdateSettings
    from drmas_train.backends.factory import build_models
    from drmas_train.collect.task_sampler import TaskSampler
    from drmas_train.distributed.errors import DistributedError
    from drmas_train.model.models import ModelNotFoundError
    from drmas_train.run.checkpoint import load_checkpoint
    from drmas_train.run.env_setup import (
        game_notes,
        game_validation_envs,
        load_env_tasks,
        make_probe_env,
        require_task_files,
        validation_tasks,
    )
    from drmas_train.run.metrics_log import MetricsLogger
    from drmas_train.run.run_dir import plan_run_dir
    from drmas_train.run.threads import configure_threads
    from drmas_train.run.updater import LocalUpdater

    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.run.dir)
    plan = plan_run_dir(run_dir, resume=resume, overwrite=overwrite, iterations=cfg.run.iterations)  # reads only
    require_task_files(cfg)  # a missing prepared file names the `drmas data prepare` command that writes it
    tasks = load_env_tasks(cfg)
    env_kwargs = dict(cfg.env.kwargs) | ({"data": tasks} if tasks is not None else {})

    def env_fn(**overrides: Any) -> Any:
        return drmas_envs.make(cfg.env.id, **(env_kwargs | overrides))

    probe = make_probe_env(cfg, env_fn)
    validate_config(cfg, list(probe.possible_agents))  # before any model loads
    tasks = probe.tasks if tasks is None else tasks
    val_tasks, notes = validation_tasks(cfg, tasks, probe)  # notes: logged once the run starts (a refused one prints only its error)
    game_envs = game_validation_envs(cfg, env_fn, probe) if cfg.eval.every > 0 else {}  # games: one per opponent
    notes += game_notes(cfg, probe)

    configure_threads(cfg.run.num_threads)  # 0 = the cores available; warns once if others keep them busy now
    specs = model_specs(cfg)
    try:
        pool = build_models(
            specs,
            env_agents=list(probe.possible_agents),
            backend=backend_factory(cfg),
            **({"loader": loader} if loader is not None else {}),
        )
    except ModelNotFoundError as err:  # a user mistake in models.<key>.name_or_path: exit 2, nothing written
        raise ConfigError(f"models: {err}") from None
    optimizers, ref_models = {}, {}
    a = cfg.algorithm
    settings = UpdateSettings.from_config(a, cfg.optim, temperature=cfg.rollout.temperature, critic=cfg.critic)  # once
    trainable = [mid for mid, loaded in pool.models.items() if loaded.spec.trainable]
    keys = critic_keys(cfg.agents, trainable, cfg.critic.per) if needs_critic(a.estimator) else {}  # agent -> critic
    if cfg.distributed.enabled:  # the trainable models train and sample on Ray worker groups
        try:
            from drmas_train.distributed.updater import RayUpdater
        except ImportError as err:
            raise DistributedError(f"distributed.enabled needs Ray: pip install 'drmas[train]' ({err})") from err

        if not trainable:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        hf_engines = cfg.distributed.generation_engine == "hf"
        updater: Any = RayUpdater.build(
            settings, cfg.distributed, cfg.optim, pool, trainable, seed=cfg.seed,
            backend_kwargs={"autocast": cfg.rollout.autocast} if hf_engines else None,
            max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens,
            keep_reference=bool(a.reward_kl_coef), critic=cfg.critic if keys else None, critic_keys=keys,
            **({"loader": loader} if loader is not None else {}),
        )  # fmt: skip
    else:
        from drmas_train.model.adapters import adapter_parameters
        from drmas_train.model.precision import frozen_copy, warn_low_precision_master

        refs: dict[int, Any] = {}  # one frozen copy per loaded model object (adapters of one base share theirs)
        for model_id, loaded in pool.models.items():
            if not loaded.spec.trainable:
                continue
            o = cfg.optim
            if o.master_dtype == "model" and not (loaded.spec.lora or loaded.spec.adapter):
                warn_low_precision_master(model_id, loaded.spec.dtype, loaded.spec.optimizer.get("lr", o.lr))
            optimizers[model_id] = build_optimizer(
                model_id, loaded.model, lr=loaded.spec.optimizer.get("lr", o.lr),
                weight_decay=loaded.spec.optimizer.get("weight_decay", o.weight_decay), betas=o.betas,
                warmup_steps=o.warmup_steps, grad_clip=o.grad_clip, offload=o.offload,
                params=adapter_parameters(loaded) if loaded.spec.adapter is not None else None,
            )  # fmt: skip
            if a.kl_coef or a.reward_kl_coef:  # a new LoRA adapter starts at B = 0: its base is its reference
                if id(loaded.model) not in refs:  # held in the compute dtype, as the reference's ref model
                    refs[id(loaded.model)] = frozen_copy(loaded.model)
                ref_models[model_id] = refs[id(loaded.model)]
        if not optimizers:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        critics = {cid: build_critic(pool.models[mid].model, cid, cfg.critic, betas=cfg.optim.betas, seed=cfg.seed,
                                     offload=cfg.optim.offload)
                   for cid, mid in critic_models(keys, cfg.agents).items()}  # fmt: skip
        updater = LocalUpdater(settings, pool, optimizers, ref_models, critics, keys)
    kl_control = None
    if a.reward_kl_coef:
        kl_control = make_kl_controller(a.reward_kl_control, coef=a.reward_kl_coef, target=a.reward_kl_target,
                                        horizon=a.reward_kl_horizon)  # fmt: skip
    sampler = TaskSampler(len(tasks), cfg.rollout.batch_size, seed=cfg.seed)
    start, elapsed_before = 0, 0.0
    if plan.resume_from is not None:
        state = load_checkpoint(plan.resume_from)  # the trainer's state and the RNG states
        updater.read_state(plan.resume_from)  # the models'
        sampler.load_state_dict(state["sampler"])
        start = int(state["iteration"])
        elapsed_before = float(state.get("extra", {}).get("elapsed_s", 0.0))
        if kl_control is not None and "reward_kl_control" in state.get("extra", {}):
            kl_control.load_state_dict(state["extra"]["reward_kl_control"])
        versions = _restored_versions(cfg, updater, state, start)
        logger.info("resumed from iter %d (checkpoint %s)", start, plan.resume_from)
    else:
        versions = PolicyVersions(updater.model_ids)
    plan.apply()  # the first write: everything is validated and every model loaded
    for level, note in notes:
        logger.log(level, "%s", note)
    metrics_logger = MetricsLogger.for_run(cfg, truncate_after=start if resume else 0)  # run.loggers
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return RunState(cfg, run_dir, env_fn, tasks, val_tasks, pool, optimizers, ref_models, sampler, metrics_logger, start,
                    updater, elapsed_before, kl_control, versions=versions,
                    env_step=probe.metadata.get("reference_env_step", "round"), game_envs=game_envs)  # fmt: skip


def _restored_versions(cfg: TrainConfig, updater: Any, state: dict[str, Any], iteration: int) -> PolicyVersions:
    """The policy versions of a checkpoint (``extra["policy_versions"]``), or, for one written before drmas recorded
    them, derived from its iteration (:meth:`~drmas_train.run.policy_versions.PolicyVersions.from_iteration`)."""
    saved = state.get("extra", {}).get("policy_versions")
    if saved is not None:
        return PolicyVersions(updater.model_ids, saved)
    warmup = cfg.critic.warmup_iterations if updater.critic_keys else 0
    versions = PolicyVersions.from_iteration(updater.model_ids, iteration, policy_warmup=warmup)
    logger.info("checkpoint has no policy versions (written before drmas recorded them): derived from its iteration "
                "%d: %s", iteration, versions.state_dict())  # fmt: skip
    return versions


def compute_advantages(cfg: TrainConfig, samples: list[Any], greedy: list[Any] | None = None, **columns: Any) -> np.ndarray:
    """Advantages of the iteration's samples with the configured estimator and grouping: (B,), or (B, T) per token
    for ``gae`` (:func:`drmas_train.algorithm.sample_advantages.sample_advantages`; ``greedy``: ReMax's greedy
    samples; ``columns``: ``values``, ``token_penalty`` and ``env_step``)."""
    from drmas_train.algorithm.sample_advantages import sample_advantages

    return sample_advantages(samples, cfg.algorithm, greedy=greedy, **columns)


def _collect(run: RunState, seed: int) -> tuple[list[Any], Any, dict[str, float]]:
    """The iteration's tasks and rollout: one batch of ``rollout.batch_size`` tasks, or with
    ``rollout.filter_groups`` DAPO's dynamic sampling (:func:`drmas_train.collect.dynamic_sampling.dynamic_sampling`:
    more batches until that many groups have a reward spread; draw ``k`` plays with seed ``seed + k * 2**40``, so
    its group ids differ from every other draw's and the first draw is the unfiltered rollout)."""
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.dynamic_sampling import dynamic_sampling
    from drmas_train.collect.rollout import rollout

    r = run.cfg.rollout
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)

    def draw(k: int = 0) -> tuple[list[Any], Any]:
        tasks = [run.tasks[i] for i in run.sampler.next_batch()]
        return tasks, rollout(run.env_fn, tasks, r.group_size, run.pool, sampling, seed=seed + k * 2**40,
                              max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation,
                              progress=run.cfg.run.progress)  # fmt: skip

    if not r.filter_groups:
        tasks, result = draw()
        return tasks, result, {}
    batch = dynamic_sampling(draw, target_groups=r.batch_size, metric=r.filter_groups_metric,
                             max_batches=r.filter_groups_max_batches)  # fmt: skip
    return batch.tasks, batch.result, batch.metrics


def _advantages(run: RunState, samples: list[Any], greedy: Any, seed: int) -> tuple[list[Any], np.ndarray, dict[str, float]]:
    """The reward terms, the advantages and (PPO with a critic) the critics' update of one iteration.

    In order: DAPO's overlong penalty on each call's reward (``algorithm.overlong_buffer``); the KL in the reward
    (``algorithm.reward_kl_coef``: per-token penalties from π_old and π_ref, then the controller's update); the
    critics' values; the advantages; the critics' update on the GAE returns (before the policy's, as the reference).

    Returns:
        ``(samples, advantages, metrics)``: the samples the update trains on (rewards shaped), (B,) or (B, T)
        advantages, and the metrics of these steps.
    """
    from drmas_train.algorithm.reward_shaping import apply_overlong_penalty, kl_reward_penalty
    from drmas_train.algorithm.sample_advantages import gae_returns

    cfg, a, metrics = run.cfg, run.cfg.algorithm, {}
    greedy_samples = greedy.samples if greedy is not None else None
    if a.overlong_buffer:
        shape = {"max_length": cfg.rollout.max_new_tokens, "buffer": a.overlong_buffer, "factor": a.overlong_penalty_factor}
        samples, metrics = apply_overlong_penalty(samples, **shape)
        if greedy_samples is not None:  # ReMax's baseline is scored as the samples are
            greedy_samples, _ = apply_overlong_penalty(greedy_samples, **shape)
    columns: dict[str, Any] = {}
    if run.kl_control is not None:
        logprobs, ref = run.updater.kl_logprobs(samples)
        beta = run.kl_control.value
        columns["token_penalty"], mean_kl = kl_reward_penalty(logprobs, ref, [s.response_mask for s in samples],
                                                              estimator=a.reward_kl_estimator, coef=beta)  # fmt: skip
        run.kl_control.update(mean_kl, len(samples))
        metrics.update({"reward/kl_penalty": mean_kl, "reward/kl_coef": beta})
    if run.updater.critic_keys:
        columns["values"] = run.updater.critic_values(samples)
    adv = compute_advantages(cfg, samples, greedy_samples, env_step=run.env_step, **columns)
    if "values" in columns:
        returns = gae_returns(samples, columns["values"], a, token_penalty=columns.get("token_penalty"))
        metrics.update(_value_metrics(samples, columns["values"], returns))
        metrics.update(run.updater.update_critics(samples, columns["values"], returns, seed))
    return samples, adv, metrics


def _value_metrics(samples: list[Any], values: list[np.ndarray], returns: list[np.ndarray]) -> dict[str, float]:
    """The critic's fit to this iteration's returns before its update (fresh data, so the values were learnt on
    earlier batches only), per agent over its response tokens: ``critic/<agent>/explained_variance`` =
    1 - Var(R - V) / Var(R) (1 is perfect, 0 no better than a constant; NaN when the returns are constant, float
    residue included), ``critic/<agent>/value_mse`` = mean (R - V)^2,
    ``values_mean`` and ``returns_mean``."""
    out: dict[str, float] = {}
    for agent in sorted({s.agent_id for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.agent_id == agent and len(values[i])]
        if not rows:
            continue
        v = np.concatenate([values[i] for i in rows])
        ret = np.concatenate([returns[i] for i in rows])
        var = float(np.var(ret))
        # undefined (NaN) for returns that are constant up to float residue: 1e-12 of their scale, squared
        spread = var > (1e-12 * max(float(np.abs(ret).max()), 1.0)) ** 2
        out[f"critic/{agent}/explained_variance"] = 1.0 - float(np.var(ret - v)) / var if spread else float("nan")
        out[f"critic/{agent}/value_mse"] = float(np.mean((ret - v) ** 2))
        out[f"critic/{agent}/values_mean"] = float(v.mean())
        out[f"critic/{agent}/returns_mean"] = float(ret.mean())
    return out


def _greedy_baseline(run: RunState, tasks: list[Any], result: Any, seed: int) -> Any:
    """ReMax's baseline: one greedy episode per task by the same rollout engine
    (:mod:`drmas_train.collect.greedy_rollout`), or None when the estimator needs none."""
    from drmas_train.algorithm.advantages import needs_greedy_baseline

    if not needs_greedy_baseline(run.cfg.algorithm.estimator):
        return None
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.greedy_rollout import greedy_rollout

    r = run.cfg.rollout
    sampling = SamplingParams(temperature=0.0, max_new_tokens=r.max_new_tokens)
    return greedy_rollout(run.env_fn, tasks, run.pool, sampling, result, seed=seed, max_prompt_tokens=r.max_prompt_tokens,
                          truncation=r.truncation, progress=run.cfg.run.progress)  # fmt: skip


def padded_batch(run: RunState, samples: list[Any], seed: int) -> list[Any]:
    """The iteration's samples, each trainable model's padded by duplication as the reference does
    (``algorithm.batch_padding: duplicate``, :func:`drmas_train.algorithm.batch_layout.pad_by_model`): up to a
    multiple of ``lcm(log_prob_micro_batch_size, loss_micro_batch_size) x`` its ranks. ``samples`` come first, the
    duplicates (the same Sample objects) after them."""
    from drmas_train.algorithm.batch_layout import pad_by_model, padding_multiple

    a = run.cfg.algorithm
    if a.batch_padding == "none" or not samples:
        return list(samples)
    multiples = {mid: padding_multiple(run.updater.world_size(mid), a.loss_micro_batch_size, a.log_prob_micro_batch_size)
                 for mid in run.updater.model_ids}  # fmt: skip
    rng = np.random.default_rng([seed, 0x9ADD])  # seeded per iteration: a resumed run pads the same way
    return [samples[i] for i in pad_by_model([s.model_id for s in samples], multiples, rng)]


def _update_models(run: RunState, samples: list[Any], adv: np.ndarray, seed: int) -> dict[str, float]:
    """One PPO update per trainable model on its own agents' samples (``run.updater``); the new weights reach
    the backends."""
    return run.updater.update(samples, adv, seed)


def _validate(run: RunState, iteration: int) -> dict[str, float]:
    """avg@k (with its standard error over tasks) and unbiased pass@k (``drmas_train.eval.metrics``) of the current
    policy on the held-out tasks; per-task scores go to ``run_dir/validation/iter_<N>.json``.

    When the run validated its initial weights (``eval.before_train``), later validations also report the paired
    gain over them: ``val/avg@k_gain`` = mean over tasks of (score now - score at iteration 0), with its standard
    error ``val/avg@k_gain_stderr`` (paired, so the tasks' difficulty spread cancels).

    Games (``run.game_envs``: one env per opponent, :func:`~drmas_train.run.env_setup.game_validation_envs`):
    ``eval.k`` episodes against each opponent, on the seed :data:`GAME_VALIDATION_SEED` at every validation (the
    same deals and seats), logged per role as ``val/<opponent>/<role>/{return,win,draw,loss}`` with ``_se``
    (:func:`drmas_train.eval.game_metrics.role_metrics`), plus ``val/<opponent>/return_gain`` and ``_se``: the
    mean over episodes of (return now - return at iteration 0), paired by episode. ``val/avg@k`` is the first
    opponent's win rate of the learning seats' reference (``EpisodeRecord.won``)."""
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout
    from drmas_train.eval.game_metrics import episode_returns, paired_gain, role_metrics
    from drmas_train.eval.metrics import avg_at_k, mean_stderr, pass_at_k_tasks

    e, r = run.cfg.eval, run.cfg.rollout
    sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_new_tokens=r.max_new_tokens)

    def play(env_fn: Any, seed: int) -> Any:
        return rollout(env_fn, run.val_tasks, e.k, run.pool, sampling, seed=seed, max_prompt_tokens=r.max_prompt_tokens,
                       truncation=r.truncation, progress=run.cfg.run.progress, label="validation")  # fmt: skip

    games: dict[str, Any] = {}
    if run.game_envs:  # one rollout per opponent, the same seeds at every validation: paired by episode
        games = {name: play(env_fn, GAME_VALIDATION_SEED) for name, env_fn in run.game_envs.items()}
        result = next(iter(games.values()))  # avg@k: the first opponent's (the learner's wins)
    else:
        result = play(run.env_fn, 10_000_019 + iteration)
    by_task: dict[str, list[bool]] = {}
    for t in result.trajectories:
        by_task.setdefault(t.task_id, []).append(bool(t.won))
    flags = list(by_task.values())
    avg = avg_at_k(flags)
    out = {f"val/avg@{e.k}": avg.value, f"val/avg@{e.k}_stderr": avg.stderr or 0.0,
           f"val/pass@{e.k}": pass_at_k_tasks([(len(f), sum(f)) for f in flags], e.k).value}  # fmt: skip
    scores = {task: sum(f) / len(f) for task, f in by_task.items()}
    folder = run.run_dir / "validation"
    folder.mkdir(exist_ok=True)
    returns = {name: episode_returns([t.episode for t in res.trajectories]) for name, res in games.items()}
    saved: dict[str, Any] = {"iteration": iteration, "k": e.k, "scores": scores}
    if returns:
        saved["game_returns"] = returns  # per opponent, each episode's return (its learners' mean), in seed order
    (folder / f"iter_{iteration:06d}.json").write_text(json.dumps(saved))
    first = folder / "iter_000000.json"
    before = json.loads(first.read_text()) if iteration > 0 and first.is_file() else None
    if before is not None:
        common = [t for t in scores if t in before["scores"]]
        if len(common) >= 2:
            gain = mean_stderr([scores[t] - before["scores"][t] for t in common])
            out.update({f"val/avg@{e.k}_gain": gain.value, f"val/avg@{e.k}_gain_stderr": gain.stderr or 0.0})
    for name, res in games.items():  # games: per role and pooled, against each opponent
        out.update(role_metrics([t.episode for t in res.trajectories], f"val/{name}"))
        earlier = (before or {}).get("game_returns", {}).get(name)
        if earlier is not None and len(earlier) == len(returns[name]) >= 2:
            value, se = paired_gain(returns[name], earlier)
            out.update({f"val/{name}/return_gain": value, f"val/{name}/return_gain_se": se or 0.0})
    return out


def _game_validation_lines(iteration: int, m: Mapping[str, float], names: list[str]) -> list[str]:
    """One console line per game validation: the pooled return and win/draw/loss rates ± SE, and the paired
    return gain over iteration 0 when known."""
    from drmas_train.eval.game_metrics import stats_line

    lines = []
    for name in names:
        if f"val/{name}/all/return" not in m:
            continue
        line = f"iter {iteration}: validation vs {name}: {stats_line(m, f'val/{name}')}"
        if f"val/{name}/return_gain" in m:
            line += f" (return gain over iteration 0: {m[f'val/{name}/return_gain']:+.3f} ± " \
                    f"{m[f'val/{name}/return_gain_se']:.3f}, paired by episode)"
        lines.append(line)
    return lines


#: the seed of every game validation's rollout: each validation plays the same deals and seats (paired gains)
GAME_VALIDATION_SEED = 10_000_019


def _validation_line(iteration: int, m: dict[str, float]) -> str:
    """``validation avg@k = v ± se`` (and the paired gain over iteration 0 when known)."""
    key = next(k for k in m if k.startswith("val/avg@") and "_" not in k.split("@", 1)[1])
    line = f"iter {iteration}: validation {key[4:]} = {m[key]:.3f} ± {m[key + '_stderr']:.3f}"
    if key + "_gain" in m:
        line += f" (gain over iteration 0: {m[key + '_gain']:+.3f} ± {m[key + '_gain_stderr']:.3f}, paired)"
    return line


def _save(run: RunState, iteration: int) -> Path:
    """An atomic checkpoint of ``iteration``: the updater writes the models' part, the run the rest."""
    from drmas_train.run.checkpoint import save_checkpoint

    extra: dict[str, Any] = {"elapsed_s": run.elapsed(), "policy_versions": run.versions.state_dict()}
    if run.kl_control is not None:  # the adaptive KL coefficient moves with training
        extra["reward_kl_control"] = run.kl_control.state_dict()
    write_state, sampler_state = run.updater.write_state, run.sampler.state_dict()
    if run.async_snapshot is not None:  # async: the buffer, the generation side and the sampler as the step left them
        from drmas_train.run.async_generation import write_async_state

        snapshot = run.async_snapshot
        sampler_state = snapshot["sampler"]

        def write_state(folder: Path) -> None:
            run.updater.write_state(folder)
            write_async_state(folder, snapshot)

    return save_checkpoint(run.run_dir / "checkpoints", iteration, write_state=write_state,
                           sampler_state=sampler_state, config_yaml=to_yaml(run.cfg),
                           extra=extra, keep=run.cfg.run.keep_checkpoints)  # fmt: skip


def train(cfg: TrainConfig, *, resume: bool = False, loader: Any = None, overwrite: bool = False) -> dict[str, Any]:
    """Run ``cfg.run.iterations`` training iterations (continuing from the latest checkpoint with ``resume``).

    ``loader``, ``overwrite``: see :func:`build_run`. Per-iteration summaries go to the ``drmas_train.run.trainer``
    logger at INFO (``drmas train`` shows them; from Python call ``logging.basicConfig(level=logging.INFO)``);
    progress bars are tqdm on a terminal, one plain line per update in a log
    (:func:`drmas_train.collect.progress.progress_bar`).

    Ctrl-C (SIGINT) saves a checkpoint of the last completed iteration (during an update, the update and its
    iteration finish first), logs where, and re-raises ``KeyboardInterrupt``; ``--resume`` continues exactly from
    there (:mod:`drmas_train.run.interrupt`).

    Returns:
        the run's summary (:func:`run_summary`), also written to ``run_dir/summary.json``.

    Raises:
        ConfigError: see :func:`build_run`. KeyboardInterrupt: after the checkpoint is saved.
        RunFinished: ``resume`` of a run that already reached ``run.iterations``; nothing was loaded or written.
    """
    from tqdm.contrib.logging import logging_redirect_tqdm

    from drmas_train.run.interrupt import SigintGuard

    with SigintGuard() as guard, logging_redirect_tqdm():
        try:
            return _train(cfg, resume=resume, loader=loader, overwrite=overwrite, guard=guard)
        except KeyboardInterrupt:
            guard.save_interrupted(_save)  # before the updater closes: a Ray updater saves from its ranks
            raise
        finally:
            if guard.run is not None:
                guard.run.updater.close()  # Ray worker groups (and a Ray started for the run); a no-op in-process


def _train(cfg: TrainConfig, *, resume: bool, loader: Any, overwrite: bool, guard: Any) -> dict[str, Any]:
    """:func:`train`'s loop; ``guard`` (:class:`~drmas_train.run.interrupt.SigintGuard`) holds SIGINT during updates."""
    from drmas_train.collect.progress import progress_bar
    from drmas_train.run.agent_health import HealthMonitor
    from drmas_train.run.metrics_log import plot_run

    run = build_run(cfg, resume=resume, loader=loader, overwrite=overwrite)
    guard.attach(run)
    health = HealthMonitor(run.pool.agent_model_ids, cfg.run.health_warn_ratio, cfg.algorithm.estimator,
                           cfg.algorithm.grouping)  # fmt: skip
    bar = progress_bar(desc="train", unit="iter", disable=not cfg.run.progress, initial=run.start_iteration, total=cfg.run.iterations)
    if cfg.eval.every > 0 and cfg.eval.before_train and run.start_iteration == 0:
        first = _validate(run, 0)  # the initial weights, as the reference's val_before_train
        run.logger.log(0, first)
        for line in _game_validation_lines(0, first, list(run.game_envs)) or [_validation_line(0, first)]:
            logger.info("%s", line)
    try:
        (_train_async if cfg.run.mode == "async" else _train_sync)(run, guard, health, bar)
    finally:
        bar.close()  # on Ctrl-C too: the bar's line ends before "drmas train: interrupted"
    run.logger.close()
    plot = None
    if cfg.run.plot and run.logger.path.is_file():
        plot = plot_run(run.logger.path, run.run_dir / "training_curves.png", title=plot_title(cfg))
    summary = run_summary(run, plot=plot)
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _train_sync(run: RunState, guard: Any, health: Any, bar: Any) -> None:
    """The synchronous loop (``run.mode: sync``): each iteration generates with the current weights, then updates
    every trained model on those samples (the reference's loop)."""
    from drmas_train.collect.rollout import save_samples
    from drmas_train.distributed.errors import DistributedError

    cfg = run.cfg
    it = run.start_iteration
    while it < cfg.run.iterations:
        seed = _iteration_seed(cfg, it)  # per-iteration seed: a resumed run replays the same draws
        t0 = time.perf_counter()
        run.updater.start_iteration(it + 1)
        tasks, result, collected = _collect(run, seed)  # one batch, or DAPO's dynamic sampling
        run.versions.stamp(result.samples)  # generated with the weights of the current versions (sync)
        greedy = _greedy_baseline(run, tasks, result, seed)  # ReMax only, else None
        guard.hold(f"iteration {it + 1}")  # from here to the checkpoint, Ctrl-C waits for the iteration to finish
        if cfg.run.save_samples:
            save_samples(result.samples, run.run_dir / "samples" / f"iter_{it + 1:06d}.jsonl")
        t1 = time.perf_counter()
        metrics = dict(collected)
        metrics.update(_game_metrics(result))  # games: each learning seat's return and win/draw/loss rates
        if greedy is not None:
            metrics["rollout/greedy_score_mean"] = float(np.mean([t.score for t in greedy.trajectories]))
        try:
            _learn(run, it, result.samples, greedy, seed, metrics)
        except DistributedError as err:  # a training rank died: rewind to the last checkpoint (bounded) or stop
            it = _rewind(run, err)
            logger.warning("training rank lost: %s; restarted from checkpoint iteration %d", err, it)
            bar.n = it
            guard.release(it)
            continue
        _end_iteration(run, it, metrics, health, t0, t1, result.timing)
        it += 1
        bar.update(1)
        guard.release(it)  # iteration complete; a Ctrl-C received meanwhile raises here


def _is_game_rollout(result: Any) -> bool:
    from drmas_train.eval.game_metrics import is_game_episode

    return bool(result.trajectories) and all(is_game_episode(t.episode) for t in result.trajectories)


def _game_metrics(result: Any) -> dict[str, float]:
    """``game/<role>/{return,win,draw,loss}`` (with ``_se`` and ``episodes``) of a rollout of game episodes: each
    learning seat's game return (before format penalties) and results
    (:func:`drmas_train.eval.game_metrics.role_metrics`); empty when an episode is not a game's."""
    from drmas_train.eval.game_metrics import role_metrics

    return role_metrics([t.episode for t in result.trajectories], "game") if _is_game_rollout(result) else {}


def _iteration_seed(cfg: TrainConfig, it: int) -> int:
    """The seed of iteration ``it`` (0-based): its rollout's (in async mode, the ``it``-th generated batch's), its
    padding's and its update's."""
    return cfg.seed * 1_000_003 + it


def _learn(run: RunState, it: int, consumed: list[Any], greedy: Any, seed: int, metrics: dict[str, float], *,
           in_flight: Any = None) -> None:  # fmt: skip
    """One iteration's learning on the samples it consumes: the reference's padding, the reward terms and
    advantages (critics updated), then one PPO update per trained model (after the critic's warm-up) and its
    version advanced. Adds the metrics to ``metrics``; shared by the synchronous and asynchronous loops.

    With ``in_flight`` (:class:`~drmas_train.run.pacing.InFlightUpdates`, ``run.pacing: per_model``) the updates
    are only started: their metrics and the versions come when each finishes.

    Raises:
        DistributedError: a training rank died (the Ray updater).
    """
    cfg = run.cfg
    padded = padded_batch(run, consumed, seed)  # the reference's duplicates: in the statistics and the gradient
    samples, adv, shaped = _advantages(run, padded, greedy, seed)  # (B',) or (B', T), B' = B + padding; critics updated
    n = len(consumed)
    metrics.update({**batch_metrics(samples[:n], adv[:n]), **shaped})
    metrics["rollout/padding_samples"] = float(len(samples) - n)
    if it >= cfg.critic.warmup_iterations or not run.updater.critic_keys:
        metrics.update(staleness_metrics(samples, run.versions))  # versions of the update's start: π_prox
        if in_flight is not None:
            in_flight.start(samples, adv, seed, it)
            return
        metrics.update(_update_models(run, samples, adv, seed))
        run.versions.advance({s.model_id for s in samples} & set(run.updater.model_ids))
    else:  # the critic's warm-up: the policy waits
        run.updater.resume_generation()
    metrics.update(run.versions.metrics())


def _save_due(cfg: TrainConfig, it: int) -> bool:
    """Whether iteration ``it`` (0-based) ends with a checkpoint (``run.save_every``, and always the last one)."""
    return (cfg.run.save_every > 0 and (it + 1) % cfg.run.save_every == 0) or it + 1 == cfg.run.iterations


def _validation_due(cfg: TrainConfig, it: int) -> bool:
    """Whether iteration ``it`` (0-based) ends with a validation (``eval.every``, and always the last one)."""
    return cfg.eval.every > 0 and ((it + 1) % cfg.eval.every == 0 or it + 1 == cfg.run.iterations)


def _warn_stalled_updates(run: RunState, iteration: int, metrics: Mapping[str, float]) -> None:
    """A WARNING, once per model, when an update with a non-zero gradient left (nearly) every weight unchanged
    (:func:`drmas_train.algorithm.update_size.stalled_updates`): its steps round away, e.g. bf16 weights stepped
    directly at a small learning rate."""
    from drmas_train.algorithm.update_size import MIN_CHANGED_FRAC, stalled_updates

    for model_id, frac in stalled_updates(dict(metrics)).items():
        if model_id not in run.stalled_warned:
            run.stalled_warned.add(model_id)
            logger.warning("model %r: iteration %d's update had a non-zero gradient but changed only %.1f %% of the "
                           "weights that had one (below %.0f %%): its optimizer steps are being rounded away. Keep "
                           "float32 master weights (optim.master_dtype: float32) or raise the learning rate; "
                           "loss/%s/update_changed_frac tracks it", model_id, iteration, 100 * frac,
                           100 * MIN_CHANGED_FRAC, model_id)  # fmt: skip


def _end_iteration(run: RunState, it: int, metrics: dict[str, float], health: Any, t0: float, t1: float,
                   timing: Mapping[str, float]) -> None:  # fmt: skip
    """The end of iteration ``it`` (0-based), after its update: agent-health signals, validation when due, timings
    (``t0``: the iteration's start, ``t1``: its samples ready; ``timing``: its rollouts' :class:`RolloutResult`
    timing, summed, for ``perf/generate_s`` and each model's throughput; ``perf/elapsed_s``: the run's wall-clock
    seconds so far (:meth:`RunState.elapsed`: from the end of model loading, earlier processes of a resumed run
    included), the metrics row and summary line, the checkpoint when due."""
    from drmas_train.collect.rollout import model_throughput

    cfg = run.cfg
    metrics.update(health.check(it + 1, metrics)[0])  # per-agent runaway signals; warns when one crosses
    _warn_stalled_updates(run, it + 1, metrics)
    t2 = time.perf_counter()
    if _validation_due(cfg, it):
        metrics.update(_validate(run, it + 1))
    t3 = time.perf_counter()
    metrics.update({"perf/rollout_s": t1 - t0, "perf/update_s": t2 - t1, "perf/eval_s": t3 - t2,
                    "perf/generate_s": timing.get("generate", 0.0), "perf/iteration_s": t3 - t0,
                    "perf/elapsed_s": run.elapsed(), **model_throughput(timing)})  # fmt: skip
    run.logger.log(it + 1, metrics)
    logger.info("%s", _summary_line(it + 1, metrics))
    if any(k.startswith("val/avg@") for k in metrics):
        for line in (_game_validation_lines(it + 1, metrics, list(run.game_envs))
                     or [_validation_line(it + 1, metrics)]):  # games: per opponent instead of avg@k over 1 task
            logger.info("%s", line)
    if _save_due(cfg, it):
        _save(run, it + 1)


#: the asynchronous loop's bound on the batches generated for one step beyond its run-ahead; a model whose every
#: group is still beyond its staleness bound after this many stops the run with an error naming it
MAX_EXTRA_BATCHES = 8


def _train_async(run: RunState, guard: Any, health: Any, bar: Any) -> None:
    """The asynchronous loop (``run.mode: async``, docs/async.md).

    A generation side (:class:`~drmas_train.run.async_generation.GenerationSide`) holds its own copy of every
    trained model's weights and plays batches of ``rollout.batch_size`` tasks x ``group_size`` episodes with it
    (batch k: the sampler's k-th draw, seed :func:`_iteration_seed` (k)), stamping every sample with the version of
    the copy, and puts each finished episode into a :class:`~drmas_train.collect.group_buffer.GroupBuffer` whose
    bound is ``run.max_staleness`` (η) for every trained model. Batch k may be played once the trainer has finished
    k - η steps: the generation runs η batches ahead, as far as the bound lets samples be used (AReaL's rule, Fu et
    al. 2025, arXiv 2505.24298, ``max_head_offpolicyness``). Who plays them, and when, is the
    :class:`~drmas_train.run.async_producer.BatchProducer`'s: inline before each step (``run.overlap: false``, the
    deterministic schedule: batch k is generated with the weights of version max(0, k - η)), or a generation thread
    that plays while the trainer updates (``run.overlap: true``; it plays no batch beyond the last step's).
    Step t takes ``rollout.batch_size`` whole groups per model (its own part of each: its agents' samples),
    oldest first; complete groups beyond the bound are dropped and counted by the buffer; a model that still lacks
    groups gets more batches played with the current weights (at most :data:`MAX_EXTRA_BATCHES`). The step's
    samples, in the synchronous loop's order, go through :func:`_learn` (the same advantages, update and
    versions), and the trainer publishes the new weights to the generation side (``run.push_every``: the per-model
    push schedule, every update by default; a model pushed less often lags).

    With ``run.pacing: per_model`` (Ray, groups on bundles of their own; :mod:`drmas_train.run.pacing`) a step takes
    groups only for the models whose update is not running (a running one's backlog is trimmed to one batch,
    :meth:`~drmas_train.collect.group_buffer.GroupBuffer.skip`), starts their updates and waits only for the first
    running update to finish (for all of them when the step validates or checkpoints, is the last, or a Ctrl-C
    arrived): each model's version advances at its own pace (:func:`_finish_paced`).

    With η = 0 every step consumes exactly the batch generated with its own weights: the synchronous loop, bit for
    bit, in both modes. With η > 0 step t may consume samples up to η versions old, corrected by the decoupled
    objective when ``algorithm.behaviour_weight_cap`` is set.

    Metrics per step, besides the synchronous loop's: ``async/generated_batches`` (batches completed during this
    step), ``async/buffer_groups`` (groups held after the step took its own), with overlap
    ``async/generation_restarts`` (failed batches played again so far, ``run.generation_restarts``), per trained model
    ``async/<m>/dropped_groups`` and ``dropped_samples`` (cumulative), ``async/<m>/generation_version``.
    ``perf/rollout_s`` is the time the step waited for its groups (with overlap: what generation did not hide).

    Checkpoints carry the loop's state at the end of the step (``run.async_snapshot``,
    :meth:`~drmas_train.run.async_producer.BatchProducer.snapshot`); ``--resume`` restores it (and continues
    exactly, inline).

    Raises:
        RuntimeError: a model still without ``batch_size`` groups within its bound after
            :data:`MAX_EXTRA_BATCHES` more batches (its generation lags its trainer by more than η).
        GenerationThreadError: the generation thread failed (``run.overlap``) more often than
            ``run.generation_restarts`` allows, or while putting a batch; its error is the cause.
    """
    from drmas_train.algorithm.advantages import effective_grouping
    from drmas_train.algorithm.grouping import POOLED_GROUPINGS
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.group_buffer import GroupBuffer
    from drmas_train.collect.rollout import merge_timing, rollout, save_samples
    from drmas_train.distributed.errors import DistributedError
    from drmas_train.model.adapters import split_model_id
    from drmas_train.run.async_generation import EngineSide, GenerationSide, read_async_state
    from drmas_train.run.async_producer import BatchProducer
    from drmas_train.run.checkpoint import latest_checkpoint
    from drmas_train.run.pacing import InFlightUpdates

    cfg, r = run.cfg, run.cfg.rollout
    eta = cfg.run.max_staleness
    trained = list(run.updater.model_ids)
    grouping = effective_grouping(cfg.algorithm.estimator, cfg.algorithm.grouping)
    if eta > 0 and len(trained) > 1 and grouping in POOLED_GROUPINGS:
        logger.warning("run.mode=async with %d trained models, run.max_staleness=%d and grouping %r, which pools the "
                       "agents of several models in one statistic: a group whose models' parts are consumed at "
                       "different steps (or dropped for one model only) gets statistics over the parts consumed "
                       "together; per-agent groupings (prompt_agent: Dr. MAS) are not affected", len(trained), eta,
                       grouping)  # fmt: skip
    overlap = cfg.run.overlap
    ray_path = cfg.distributed.enabled
    if ray_path:  # the worker groups' engines are the generation side
        gen: Any = EngineSide(run.pool, run.versions, run.updater, staged=overlap)
    else:
        push_every = {mid: cfg.run.push_every[split_model_id(mid)[0]] for mid in trained
                      if split_model_id(mid)[0] in cfg.run.push_every}  # fmt: skip
        gen = GenerationSide(run.pool, run.versions, backend_factory(cfg), push_every=push_every, isolate=overlap)
    # a group holds its slot until every model took or dropped its part: at most (η + 1) versions' batches per
    # model are within the bound, each version with at most 1 + MAX_EXTRA_BATCHES batches
    capacity = r.batch_size * (eta + 2) * (MAX_EXTRA_BATCHES + 1)
    sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)

    def roll(tasks: list[Any], k: int, *, progress: bool) -> Any:
        return rollout(run.env_fn, tasks, r.group_size, gen.pool, sampling, seed=_iteration_seed(cfg, k),
                       max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation,
                       progress=progress and cfg.run.progress)  # fmt: skip

    def start(at: int) -> tuple[GroupBuffer, BatchProducer]:
        """The buffer and the producer at iteration ``at``: empty at 0, else as the latest checkpoint left them
        (``--resume``, or the rewind after a lost training rank)."""
        buffer = GroupBuffer(r.group_size, dict.fromkeys(trained, eta), capacity)
        resumed: dict[str, Any] = {"generated": at}  # resumed from a synchronous run's checkpoint: its iteration
        if at > 0:
            state = read_async_state(latest_checkpoint(run.run_dir / "checkpoints"))
            if state is not None:  # an asynchronous run's checkpoint: its buffer, counters and generation side
                buffer.load_state_dict(state["buffer"])
                resumed = {"generated": int(state["generated"]), "order": dict(state["order"]),
                           "plays": set(state["plays"]), "positions": int(state["positions"])}  # fmt: skip
                gen.restore(state["held"], state["weights"])
            elif ray_path:  # a synchronous run's checkpoint: the engines hold its weights (read_state pushed them)
                gen.restore(run.versions.state_dict(), {})
            logger.info("run.mode=async at iteration %d from its checkpoint: %d batches played, %d groups buffered",
                        at, resumed["generated"], buffer.held_groups())  # fmt: skip
        producer = BatchProducer(gen, buffer, lambda: [run.tasks[i] for i in run.sampler.next_batch()], roll,
                                 run.sampler.state_dict, run.sampler.load_state_dict, overlap=overlap,
                                 max_extra=MAX_EXTRA_BATCHES, restarts=cfg.run.generation_restarts, **resumed)  # fmt: skip
        return buffer, producer

    buffer, producer = start(run.start_iteration)
    last = cfg.run.iterations - 1
    in_flight = InFlightUpdates(run.updater) if cfg.run.pacing == "per_model" else None
    at_start = {m: run.versions[m] for m in trained}  # per-model pacing's pacing/<m>/updates count from here

    def ahead(t: int) -> int:  # the last batch step t may need; the generation thread plays none no step will take
        return min(t + eta, last) if overlap else t + eta

    finished = False
    try:
        it = run.start_iteration
        while it < cfg.run.iterations:
            seed = _iteration_seed(cfg, it)
            t0 = time.perf_counter()
            run.updater.start_iteration(it + 1)
            producer.allow(ahead(it))  # run ahead as far as the bound lets the samples be used
            taken: dict[str, list[list[Any]]] = {}
            for mid in trained:
                if in_flight is not None and in_flight.busy(mid):  # its update runs: its part of the groups waits,
                    buffer.skip(mid, run.versions[mid], r.batch_size)  # one batch of them at most (the freshest)
                    continue
                groups = producer.take(mid, run.versions[mid], r.batch_size)
                if groups is not None:  # None: no agent of this model acted in any episode yet: not updated, as in sync
                    taken[mid] = groups
            consumed = sorted((s for groups in taken.values() for g in groups for s in g),
                              key=lambda s: (producer.order[s.traj_uid], s.turn))  # fmt: skip
            guard.hold(f"iteration {it + 1}")
            if cfg.run.save_samples:
                save_samples(consumed, run.run_dir / "samples" / f"iter_{it + 1:06d}.jsonl")
            t1 = time.perf_counter()
            metrics: dict[str, float] = {}
            try:
                if in_flight is None:
                    versions_before = run.versions.state_dict()
                    _learn(run, it, consumed, None, seed, metrics)
                    updated = {m for m in trained if run.versions[m] != versions_before[m]}
                else:  # per-model pacing: start the idle models' updates, wait for the first (all at a barrier)
                    if consumed:
                        _learn(run, it, consumed, None, seed, metrics, in_flight=in_flight)
                    barrier = _save_due(cfg, it) or _validation_due(cfg, it) or guard.requested
                    updated = _finish_paced(run, in_flight, it, "all" if barrier else "any", metrics, at_start)
            except DistributedError as err:  # a training rank died: rewind to the last checkpoint (bounded) or stop
                producer.close()  # a generation thread finishes its batch: nothing else uses the engines meanwhile
                if in_flight is not None:  # nothing may write the weights while the checkpoint's are loaded
                    in_flight.abandon()
                it = _rewind(run, err)  # the weights, sampler, versions and metrics log of the checkpoint
                buffer, producer = start(it)  # and its buffer: its groups are consumed again, none lost or doubled
                logger.warning("training rank lost: %s; restarted from checkpoint iteration %d", err, it)
                bar.n = it
                guard.release(it)
                continue
            producer.publish(run.versions, updated)
            if overlap and it < last:  # the next step's batches may be played while this one validates and checkpoints
                producer.allow(ahead(it + 1))
            played, timings = producer.step_stats()
            counts = buffer.counts()
            metrics.update({"async/generated_batches": float(played), "async/buffer_groups": float(buffer.held_groups())})
            if overlap:
                metrics["async/generation_restarts"] = float(producer.restarts_used)
            for mid in trained:
                metrics[f"async/{mid}/dropped_groups"] = float(counts[mid].dropped_groups)
                metrics[f"async/{mid}/dropped_samples"] = float(counts[mid].dropped_samples)
                if in_flight is not None:
                    metrics[f"async/{mid}/skipped_groups"] = float(counts[mid].skipped_groups)
                    metrics[f"async/{mid}/skipped_samples"] = float(counts[mid].skipped_samples)
            metrics.update(gen.metrics())
            run.async_snapshot = producer.snapshot(run.versions)
            # on Ray the validation generates with the engines: hold the generation thread off them, at the
            # trainer's weights (its staged push loaded), while it runs
            quiet = producer.paused() if ray_path and overlap and _validation_due(cfg, it) else contextlib.nullcontext()
            with quiet:
                _end_iteration(run, it, metrics, health, t0, t1, merge_timing(timings))
            it += 1
            bar.update(1)
            guard.release(it)
        finished = True
    except KeyboardInterrupt:
        # a first Ctrl-C during a rollout: the interrupt's checkpoint holds no half update (a second one aborts)
        if in_flight is not None and in_flight.running and not guard.requested:
            _drain_on_interrupt(run, in_flight, producer, gen)
        raise
    finally:
        producer.close(wait=finished)


def _finish_paced(run: RunState, in_flight: Any, it: int, wait: str, metrics: dict[str, float],
                  at_start: Mapping[str, int]) -> set[str]:  # fmt: skip
    """Per-model pacing (``run.pacing: per_model``): collect the updates done after ``wait``
    (:meth:`~drmas_train.run.pacing.InFlightUpdates.collect`), advance their models' versions, and add to
    ``metrics`` their update metrics, the versions and per trained model ``pacing/<m>/updated`` (1: an update of it
    finished in this step), ``pacing/<m>/in_flight`` (1: its update still runs after the step),
    ``pacing/<m>/updates`` (the updates this process added to the weights: ``version/<m>`` minus ``at_start``, its
    value when the loop started) and, for each finished one,
    ``pacing/<m>/update_s`` (its wall-clock seconds, start to collection) and ``pacing/<m>/update_steps`` (steps it
    spanned: 1 = started and finished in this step).

    Returns:
        the models whose versions advanced.

    Raises:
        DistributedError: a training rank died.
    """
    done = in_flight.collect(wait)
    now = time.perf_counter()
    for mid, (update_metrics, flight) in done.items():
        metrics.update(update_metrics)
        metrics[f"pacing/{mid}/update_s"] = now - flight.started
        metrics[f"pacing/{mid}/update_steps"] = float(it - flight.step + 1)
    run.versions.advance(set(done))
    for mid, start in at_start.items():
        metrics[f"pacing/{mid}/updated"] = float(mid in done)
        metrics[f"pacing/{mid}/in_flight"] = float(in_flight.busy(mid))
        metrics[f"pacing/{mid}/updates"] = float(run.versions[mid] - start)
    metrics.update(run.versions.metrics())
    return set(done)


def _drain_on_interrupt(run: RunState, in_flight: Any, producer: Any, gen: Any) -> None:
    """Ctrl-C with per-model updates in flight: let them finish (a second Ctrl-C aborts), advance their versions
    and publish their weights, so the interrupt's checkpoint (of the last completed step, whose snapshot already
    lacks the groups they consumed) holds every update it says it holds; their metrics are not logged."""
    logger.warning("Ctrl-C: waiting for the updates of %s to finish before the checkpoint (Ctrl-C again to abort)",
                   ", ".join(sorted(in_flight.running)))  # fmt: skip
    done = in_flight.collect("all")
    run.versions.advance(set(done))
    producer.publish(run.versions, set(done))
    if run.async_snapshot is not None:  # the engines hold (or have staged) the trainer's weights now
        run.async_snapshot = {**run.async_snapshot, "side": gen.frozen(run.versions)}


def plot_title(cfg: TrainConfig) -> str:
    """``<run name> · <estimator> · <models>``: what the plot shows, at a glance."""
    models = ", ".join(sorted({m.name_or_path for m in cfg.models.values()}))
    return f"{cfg.run.name or cfg.run.dir} · estimator {cfg.algorithm.estimator} · {models}"


def run_summary(run: RunState, *, plot: Path | None) -> dict[str, Any]:
    """``summary.json`` of the whole run, read back from its files (so a resumed run's summary covers every
    process): the last metrics row, every validation, the latest checkpoint and the whole run's wall time.

    Returns:
        ``{"run_dir", "iterations", "metrics" (last row), "validation" ({iteration: val/* metrics}), "plot",
        "checkpoint", "resumed_from" (the iteration this process resumed from, or None), "wall_time_s" (all processes
        of the run), "process_wall_time_s" (this one)}``.
    """
    from drmas_train.run.checkpoint import latest_checkpoint
    from drmas_train.run.metrics_log import read_metrics

    rows = read_metrics(run.logger.path) if run.logger.path.is_file() else []
    last = {k: v for k, v in rows[-1].items() if k != "iteration"} if rows else {}
    validation = {str(r["iteration"]): {k: v for k, v in r.items() if k.startswith("val/")} for r in rows
                  if any(k.startswith("val/") for k in r)}  # fmt: skip
    ckpt = latest_checkpoint(run.run_dir / "checkpoints")
    return {"run_dir": str(run.run_dir), "iterations": run.cfg.run.iterations, "metrics": last,
            "validation": validation, "plot": str(plot) if plot else None, "checkpoint": str(ckpt) if ckpt else None,
            "resumed_from": run.start_iteration or None, "wall_time_s": run.elapsed(),
            "process_wall_time_s": time.perf_counter() - run.started}  # fmt: skip


def _rewind(run: RunState, err: Exception) -> int:
    """After a lost training rank: the updater rebuilds it from the latest checkpoint (or raises ``err`` with where
    to resume from); the sampler, RNG states and metrics log go back to that checkpoint. Returns its iteration."""
    from drmas_train.run.checkpoint import latest_checkpoint, load_checkpoint
    from drmas_train.run.metrics_log import MetricsLogger

    ckpt = latest_checkpoint(run.run_dir / "checkpoints")
    run.updater.recover(err, ckpt)
    state = load_checkpoint(ckpt)
    it = int(state["iteration"])
    run.sampler.load_state_dict(state["sampler"])
    if run.kl_control is not None and "reward_kl_control" in state.get("extra", {}):
        run.kl_control.load_state_dict(state["extra"]["reward_kl_control"])
    run.versions = _restored_versions(run.cfg, run.updater, state, it)
    run.logger.close()
    run.logger = MetricsLogger.for_run(run.cfg, truncate_after=it)
    return it


def _summary_line(iteration: int, m: dict[str, float]) -> str:
    rewards = " ".join(f"{k.split('/')[1]}={v:+.3f}" for k, v in m.items() if k.startswith("reward/") and k.endswith("/mean"))
    norms = " ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in m.items() if k.startswith("loss/") and k.endswith("/grad_norm"))
    return (f"iter {iteration}: reward {rewards} | acc {m.get('rollout/accuracy', float('nan')):.3f} | "
            f"grad_norm {norms} | {m.get('perf/iteration_s', 0):.1f}s")  # fmt: skip
