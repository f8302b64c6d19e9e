"""The training loop: sample tasks -> rollout -> advantages -> PPO update per model -> metrics -> eval -> checkpoint.

:func:`train` only orchestrates; each step is one call into the module named after it (``rollout``,
``advantages``, ``update``, ``metrics_log``, ``checkpoint``). :func:`build_run` does all the setup, validating the
config against the env *before* any model is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from drmas_train.run.config import ConfigError, TrainConfig, to_yaml, validate_config

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
    ref_models: dict[str, Any]  # model_id -> frozen reference (only when kl_coef > 0)
    sampler: Any  # TaskSampler
    logger: Any  # MetricsLogger
    start_iteration: int = 0
    updater: Any = None  # LocalUpdater (default) or distributed RayUpdater (run/updater.py lists the seam)
    elapsed_before: float = 0.0  # seconds the earlier processes of this run spent (from the checkpoint resumed)
    started: float = dataclasses.field(default_factory=time.perf_counter)  # this process's start

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
    adapters)."""
    from drmas_train.model.adapters import split_model_id
    from drmas_train.model.models import ModelSpec

    specs = {}
    for agent, name in cfg.agents.items():
        key, adapter = split_model_id(name)
        m = cfg.models[key]
        lora = _peft_lora(m.adapters[adapter] if adapter is not None else m.lora)
        overrides = {k: v for k, v in (("lr", m.lr), ("weight_decay", m.weight_decay)) if v is not None}
        specs[agent] = ModelSpec(
            m.name_or_path, dtype=m.dtype, device=m.device, trainable=m.trainable, lora=lora, optimizer=overrides,
            seed=cfg.seed, chat_template_kwargs=dict(m.chat_template_kwargs), model_id=name, adapter=adapter,
        )  # fmt: skip
    return specs


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
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.algorithm.settings import UpdateSettings
    from drmas_train.backends.factory import build_models, make_backend
    from drmas_train.collect.task_sampler import TaskSampler
    from drmas_train.distributed.errors import DistributedError
    from drmas_train.model.adapters import split_model_id
    from drmas_train.model.models import ModelNotFoundError
    from drmas_train.run.checkpoint import load_checkpoint
    from drmas_train.run.env_setup import (
        held_out_tasks,
        is_procedural,
        load_env_tasks,
        make_probe_env,
        require_task_files,
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

    def env_fn():
        return drmas_envs.make(cfg.env.id, **env_kwargs)

    probe = make_probe_env(cfg, env_fn)
    validate_config(cfg, list(probe.possible_agents))  # before any model loads
    tasks = probe.tasks if tasks is None else tasks
    val_tasks, notes = None, []  # notes: (level, message) logged once the run starts (a refused one prints only its error)
    if cfg.eval.every > 0:
        spec = cfg.eval.data or cfg.env.data
        # eval.data: its first eval.size tasks. Else procedural env.data: 1,000 candidates from another seed (the
        # training set's size does not apply), minus every training question; files / the env's own tasks: their
        # first eval.size rows, which are then not held out (warned).
        key = "eval.data" if cfg.eval.data else "env.data"
        val_src = load_env_tasks(cfg, spec, key=key, seed=cfg.seed + 10_000, size=1000) if spec else tasks
        if spec and not cfg.eval.data and is_procedural(spec):  # a small problem space repeats across seeds
            val_tasks = held_out_tasks(val_src, tasks, cfg.eval.size)
            notes.append((logging.INFO, f"validation: {len(val_tasks)} held-out {spec} tasks (questions not in the "
                                        f"{len(tasks)} training tasks)"))  # fmt: skip
        else:
            val_tasks = [val_src[i] for i in range(min(cfg.eval.size, len(val_src)))]
            if not cfg.eval.data:
                source = spec or "the env's own tasks"
                notes.append((logging.WARNING, f"validation reads the training data ({source}): its {len(val_tasks)} "
                                               "tasks are not held out; set eval.data to other problems"))  # fmt: skip

    configure_threads(cfg.run.num_threads)  # 0 = the cores available; warns once if others keep them busy now
    specs = model_specs(cfg)
    try:
        pool = build_models(
            specs,
            env_agents=list(probe.possible_agents),
            backend=lambda loaded: make_backend(loaded, cfg.models[split_model_id(loaded.model_id)[0]].backend,
                                                seed=cfg.seed),  # fmt: skip
            **({"loader": loader} if loader is not None else {}),
        )
    except ModelNotFoundError as err:  # a user mistake in models.<key>.name_or_path: exit 2, nothing written
        raise ConfigError(f"models: {err}") from None
    optimizers, ref_models = {}, {}
    settings = UpdateSettings.from_config(cfg.algorithm, cfg.optim, temperature=cfg.rollout.temperature)  # built once
    if cfg.distributed.enabled:  # the trainable models train and sample on Ray worker groups
        try:
            from drmas_train.distributed.updater import RayUpdater
        except ImportError as err:
            raise DistributedError(f"distributed.enabled needs Ray: pip install 'drmas[train]' ({err})") from err

        trainable = [mid for mid, loaded in pool.models.items() if loaded.spec.trainable]
        if not trainable:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        updater: Any = RayUpdater.build(
            settings, cfg.distributed, cfg.optim, pool, trainable, seed=cfg.seed,
            max_model_len=cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens,
            **({"loader": loader} if loader is not None else {}),
        )  # fmt: skip
    else:
        from drmas_train.model.adapters import adapter_parameters

        refs: dict[int, Any] = {}  # one frozen copy per loaded model object (adapters of one base share theirs)
        for model_id, loaded in pool.models.items():
            if not loaded.spec.trainable:
                continue
            o = cfg.optim
            optimizers[model_id] = build_optimizer(
                model_id, loaded.model, lr=loaded.spec.optimizer.get("lr", o.lr),
                weight_decay=loaded.spec.optimizer.get("weight_decay", o.weight_decay), betas=o.betas,
                warmup_steps=o.warmup_steps, grad_clip=o.grad_clip,
                params=adapter_parameters(loaded) if loaded.spec.adapter is not None else None,
            )  # fmt: skip
            if cfg.algorithm.kl_coef:  # a new LoRA adapter starts at B = 0: its base is its reference
                import copy

                if id(loaded.model) not in refs:
                    refs[id(loaded.model)] = copy.deepcopy(loaded.model).eval().requires_grad_(False)
                ref_models[model_id] = refs[id(loaded.model)]
        if not optimizers:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        updater = LocalUpdater(settings, pool, optimizers, ref_models)
    sampler = TaskSampler(len(tasks), cfg.rollout.batch_size, seed=cfg.seed)
    start, elapsed_before = 0, 0.0
    if plan.resume_from is not None:
        state = load_checkpoint(plan.resume_from)  # the trainer's state and the RNG states
        updater.read_state(plan.resume_from)  # the models'
        sampler.load_state_dict(state["sampler"])
        start = int(state["iteration"])
        elapsed_before = float(state.get("extra", {}).get("elapsed_s", 0.0))
        logger.info("resumed from iter %d (checkpoint %s)", start, plan.resume_from)
    plan.apply()  # the first write: everything is validated and every model loaded
    for level, note in notes:
        logger.log(level, "%s", note)
    metrics_logger = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, truncate_after=start if resume else 0)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return RunState(cfg, run_dir, env_fn, tasks, val_tasks, pool, optimizers, ref_models, sampler, metrics_logger, start,
                    updater, elapsed_before)  # fmt: skip


def compute_advantages(cfg: TrainConfig, samples: list[Any], greedy: list[Any] | None = None) -> np.ndarray:
    """(B,) advantages of the iteration's samples with the configured estimator and grouping
    (:func:`drmas_train.algorithm.sample_advantages.sample_advantages`; ``greedy``: ReMax's greedy samples)."""
    from drmas_train.algorithm.sample_advantages import sample_advantages

    return sample_advantages(samples, cfg.algorithm, greedy=greedy)


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
    error ``val/avg@k_gain_stderr`` (paired, so the tasks' difficulty spread cancels)."""
    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout
    from drmas_train.eval.metrics import avg_at_k, mean_stderr, pass_at_k_tasks

    e, r = run.cfg.eval, run.cfg.rollout
    sampling = SamplingParams(temperature=e.temperature, top_p=e.top_p, top_k=e.top_k, max_new_tokens=r.max_new_tokens)
    result = rollout(run.env_fn, run.val_tasks, e.k, run.pool, sampling, seed=10_000_019 + iteration,
                     max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=run.cfg.run.progress,
                     label="validation")  # fmt: skip
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
    (folder / f"iter_{iteration:06d}.json").write_text(json.dumps({"iteration": iteration, "k": e.k, "scores": scores}))
    first = folder / "iter_000000.json"
    if iteration > 0 and first.is_file():
        before = json.loads(first.read_text())["scores"]
        common = [t for t in scores if t in before]
        if len(common) >= 2:
            gain = mean_stderr([scores[t] - before[t] for t in common])
            out.update({f"val/avg@{e.k}_gain": gain.value, f"val/avg@{e.k}_gain_stderr": gain.stderr or 0.0})
    return out


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

    return save_checkpoint(run.run_dir / "checkpoints", iteration, write_state=run.updater.write_state,
                           sampler_state=run.sampler.state_dict(), config_yaml=to_yaml(run.cfg),
                           extra={"elapsed_s": run.elapsed()}, keep=run.cfg.run.keep_checkpoints)  # fmt: skip


def train(cfg: TrainConfig, *, resume: bool = False, loader: Any = None, overwrite: bool = False) -> dict[str, Any]:
    """Run ``cfg.run.iterations`` training iterations (continuing from the latest checkpoint with ``resume``).

    ``loader``, ``overwrite``: see :func:`build_run`. Per-iteration summaries go to the ``drmas_train.run.trainer``
    logger at INFO (``drmas train`` shows them; from Python call ``logging.basicConfig(level=logging.INFO)``);
    progress bars are tqdm.

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
    from tqdm.auto import tqdm

    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout, save_samples
    from drmas_train.distributed.errors import DistributedError
    from drmas_train.run.agent_health import HealthMonitor
    from drmas_train.run.metrics_log import batch_metrics, plot_run

    run = build_run(cfg, resume=resume, loader=loader, overwrite=overwrite)
    guard.attach(run)
    health = HealthMonitor(run.pool.agent_model_ids, cfg.run.health_warn_ratio, cfg.algorithm.estimator,
                           cfg.algorithm.grouping)  # fmt: skip
    r = cfg.rollout
    bar = tqdm(desc="train", unit="iter", disable=not cfg.run.progress, initial=run.start_iteration, total=cfg.run.iterations)
    if cfg.eval.every > 0 and cfg.eval.before_train and run.start_iteration == 0:
        first = _validate(run, 0)  # the initial weights, as the reference's val_before_train
        run.logger.log(0, first)
        logger.info("%s", _validation_line(0, first))
    it = run.start_iteration
    while it < cfg.run.iterations:
        seed = cfg.seed * 1_000_003 + it  # per-iteration seed: a resumed run replays the same draws
        t0 = time.perf_counter()
        run.updater.start_iteration(it + 1)
        tasks = [run.tasks[i] for i in run.sampler.next_batch()]
        sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        result = rollout(run.env_fn, tasks, r.group_size, run.pool, sampling, seed=seed,
                         max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=cfg.run.progress)  # fmt: skip
        greedy = _greedy_baseline(run, tasks, result, seed)  # ReMax only, else None
        guard.hold(f"iteration {it + 1}")  # from here to the checkpoint, Ctrl-C waits for the iteration to finish
        if cfg.run.save_samples:
            save_samples(result.samples, run.run_dir / "samples" / f"iter_{it + 1:06d}.jsonl")
        t1 = time.perf_counter()
        samples = padded_batch(run, result.samples, seed)  # the reference's duplicates, in the statistics and the gradient
        adv = compute_advantages(cfg, samples, greedy.samples if greedy is not None else None)  # (B + padding,)
        metrics = batch_metrics(result.samples, adv[: len(result.samples)])
        metrics["rollout/padding_samples"] = float(len(samples) - len(result.samples))
        if greedy is not None:
            metrics["rollout/greedy_score_mean"] = float(np.mean([t.score for t in greedy.trajectories]))
        try:
            metrics.update(_update_models(run, samples, adv, seed))
        except DistributedError as err:  # a training rank died: rewind to the last checkpoint (bounded) or stop
            it = _rewind(run, err)
            logger.warning("training rank lost: %s; restarted from checkpoint iteration %d", err, it)
            bar.n = it
            guard.release(it)
            continue
        metrics.update(health.check(it + 1, metrics)[0])  # per-agent runaway signals; warns when one crosses
        t2 = time.perf_counter()
        if cfg.eval.every > 0 and ((it + 1) % cfg.eval.every == 0 or it + 1 == cfg.run.iterations):
            metrics.update(_validate(run, it + 1))
        t3 = time.perf_counter()
        metrics.update({"perf/rollout_s": t1 - t0, "perf/update_s": t2 - t1, "perf/eval_s": t3 - t2,
                        "perf/generate_s": result.timing.get("generate", 0.0), "perf/iteration_s": t3 - t0})  # fmt: skip
        run.logger.log(it + 1, metrics)
        logger.info("%s", _summary_line(it + 1, metrics))
        if any(k.startswith("val/avg@") for k in metrics):
            logger.info("%s", _validation_line(it + 1, metrics))
        if (cfg.run.save_every > 0 and (it + 1) % cfg.run.save_every == 0) or it + 1 == cfg.run.iterations:
            _save(run, it + 1)
        it += 1
        bar.update(1)
        guard.release(it)  # iteration complete; a Ctrl-C received meanwhile raises here
    bar.close()
    run.logger.close()
    plot = None
    if cfg.run.plot and run.logger.path.is_file():
        plot = plot_run(run.logger.path, run.run_dir / "training_curves.png", title=plot_title(cfg))
    summary = run_summary(run, plot=plot)
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


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
    run.logger.close()
    run.logger = MetricsLogger(run.run_dir, tensorboard=run.cfg.run.tensorboard, truncate_after=it)
    return it


def _summary_line(iteration: int, m: dict[str, float]) -> str:
    rewards = " ".join(f"{k.split('/')[1]}={v:+.3f}" for k, v in m.items() if k.startswith("reward/") and k.endswith("/mean"))
    norms = " ".join(f"{k.split('/')[1]}={v:.3f}" for k, v in m.items() if k.startswith("loss/") and k.endswith("/grad_norm"))
    return (f"iter {iteration}: reward {rewards} | acc {m.get('rollout/accuracy', float('nan')):.3f} | "
            f"grad_norm {norms} | {m.get('perf/iteration_s', 0):.1f}s")  # fmt: skip
