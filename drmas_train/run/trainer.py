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
    updater: Any = None  # LocalUpdater (default) or distributed.RayUpdater: .update / .save / .load / .close


def model_specs(cfg: TrainConfig) -> dict[str, Any]:
    """``agent_id -> ModelSpec`` for :func:`drmas_train.model.assignment.build_models`; the config key is the model id,
    so agents naming the same key share one model and different keys never do."""
    from drmas_train.model.models import ModelSpec

    specs = {}
    for agent, key in cfg.agents.items():
        m = cfg.models[key]
        lora = None
        if m.lora is not None:
            lora = {"r": m.lora.r, "lora_alpha": m.lora.alpha, "lora_dropout": m.lora.dropout,
                    "target_modules": list(m.lora.target_modules)}  # fmt: skip
        overrides = {k: v for k, v in (("lr", m.lr), ("weight_decay", m.weight_decay)) if v is not None}
        specs[agent] = ModelSpec(
            m.name_or_path, dtype=m.dtype, device=m.device, trainable=m.trainable, lora=lora, optimizer=overrides,
            seed=cfg.seed, chat_template_kwargs=dict(m.chat_template_kwargs), model_id=key,
        )  # fmt: skip
    return specs


def build_run(cfg: TrainConfig, *, resume: bool = False, loader: Any = None, overwrite: bool = False) -> RunState:
    """Seed, load tasks, check the config against the env, load models, build optimizers, restore a checkpoint.

    ``loader`` (``(ModelSpec, model_id) -> LoadedModel``, default :func:`drmas_train.model.models.load_model`) lets
    tests and embedding code supply their own models. ``overwrite``: delete the results of an earlier run in
    ``run.dir`` instead of refusing it (:mod:`drmas_train.run.run_dir`).

    Raises:
        ConfigError: raised before any model loads: ``run.dir`` holds an earlier run (without ``resume`` or
            ``overwrite``), ``resume`` without a checkpoint in ``run.dir``, a prepared task file named by the config is missing, ``env.data`` / ``env.id`` /
            ``env.kwargs`` the env cannot take, or env agents that do not match ``cfg.agents``.
    """
    import drmas_envs
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.collect.task_sampler import TaskSampler
    from drmas_train.model.assignment import build_models, make_backend
    from drmas_train.run.data_prep import require_task_files
    from drmas_train.run.env_setup import held_out_tasks, is_procedural, load_env_tasks, make_probe_env
    from drmas_train.run.metrics_log import MetricsLogger
    from drmas_train.run.run_dir import prepare_run_dir
    from drmas_train.run.threads import configure_threads
    from drmas_train.run.updater import LocalUpdater

    configure_threads(cfg.run.num_threads)  # 0 = the cores available; warns once if others already load them
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    run_dir = Path(cfg.run.dir)
    resume_ckpt = prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)  # refusals before anything loads
    require_task_files(cfg)  # a missing prepared file names the `drmas data prepare` command that writes it
    tasks = load_env_tasks(cfg)
    env_kwargs = dict(cfg.env.kwargs) | ({"data": tasks} if tasks is not None else {})

    def env_fn():
        return drmas_envs.make(cfg.env.id, **env_kwargs)

    probe = make_probe_env(cfg, env_fn)
    validate_config(cfg, list(probe.possible_agents))  # before any model loads
    tasks = probe.tasks if tasks is None else tasks
    val_tasks = None
    if cfg.eval.every > 0:
        spec = cfg.eval.data or cfg.env.data
        # eval.data: its first eval.size tasks. Else procedural env.data: 1,000 candidates from another seed (the
        # training set's size does not apply), minus every training question; files / the env's own tasks: their
        # first eval.size rows, which are then not held out (warned).
        key = "eval.data" if cfg.eval.data else "env.data"
        val_src = load_env_tasks(cfg, spec, key=key, seed=cfg.seed + 10_000, size=1000) if spec else tasks
        if spec and not cfg.eval.data and is_procedural(spec):  # a small problem space repeats across seeds
            val_tasks = held_out_tasks(val_src, tasks, cfg.eval.size)
            logger.info("validation: %d held-out %s tasks (questions not in the %d training tasks)",
                        len(val_tasks), spec, len(tasks))  # fmt: skip
        else:
            val_tasks = [val_src[i] for i in range(min(cfg.eval.size, len(val_src)))]
            if not cfg.eval.data:
                logger.warning("validation reads the training data (%s): its %d tasks are not held out; set eval.data "
                               "to other problems", spec or "the env's own tasks", len(val_tasks))  # fmt: skip

    specs = model_specs(cfg)
    pool = build_models(
        specs,
        env_agents=list(probe.possible_agents),
        backend=lambda loaded: make_backend(loaded, cfg.models[loaded.model_id].backend, seed=cfg.seed),
        **({"loader": loader} if loader is not None else {}),
    )
    optimizers, ref_models = {}, {}
    if cfg.distributed.enabled:  # the trainable models train and sample on Ray worker groups
        from drmas_train.distributed.updater import RayUpdater

        trainable = [mid for mid, loaded in pool.models.items() if loaded.spec.trainable]
        if not trainable:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        updater: Any = RayUpdater.build(cfg, pool, trainable, **({"loader": loader} if loader is not None else {}))
    else:
        for model_id, loaded in pool.models.items():
            if not loaded.spec.trainable:
                continue
            o = cfg.optim
            optimizers[model_id] = build_optimizer(
                model_id, loaded.model, lr=loaded.spec.optimizer.get("lr", o.lr),
                weight_decay=loaded.spec.optimizer.get("weight_decay", o.weight_decay), betas=o.betas,
                warmup_steps=o.warmup_steps, grad_clip=o.grad_clip,
            )  # fmt: skip
            if cfg.algorithm.kl_coef:
                import copy

                ref_models[model_id] = copy.deepcopy(loaded.model).eval().requires_grad_(False)
        if not optimizers:
            raise ConfigError("no trainable model: set trainable: true on at least one model")
        updater = LocalUpdater(cfg, pool, optimizers, ref_models)
    sampler = TaskSampler(len(tasks), cfg.rollout.batch_size, seed=cfg.seed)
    start = 0
    if resume_ckpt is not None:
        state = updater.load(resume_ckpt)
        sampler.load_state_dict(state["sampler"])
        start = int(state["iteration"])
        logger.info("resumed from iter %d (checkpoint %s)", start, resume_ckpt)
    metrics_logger = MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, truncate_after=start if resume else 0)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return RunState(cfg, run_dir, env_fn, tasks, val_tasks, pool, optimizers, ref_models, sampler, metrics_logger, start,
                    updater)  # fmt: skip


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
                     max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=run.cfg.run.progress)  # fmt: skip
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
    return run.updater.save(run.run_dir / "checkpoints", iteration, sampler_state=run.sampler.state_dict(),
                            config_yaml=to_yaml(run.cfg), keep=run.cfg.run.keep_checkpoints)  # fmt: skip


def train(cfg: TrainConfig, *, resume: bool = False, loader: Any = None, overwrite: bool = False) -> dict[str, Any]:
    """Run ``cfg.run.iterations`` training iterations (continuing from the latest checkpoint with ``resume``).

    ``loader``, ``overwrite``: see :func:`build_run`. Per-iteration summaries go to the ``drmas_train.run.trainer``
    logger at INFO (``drmas train`` shows them; from Python call ``logging.basicConfig(level=logging.INFO)``);
    progress bars are tqdm.

    Ctrl-C (SIGINT) saves a checkpoint of the last completed iteration (during an update, the update and its
    iteration finish first), logs where, and re-raises ``KeyboardInterrupt``; ``--resume`` continues exactly from
    there (:mod:`drmas_train.run.interrupt`).

    Returns:
        ``{"run_dir", "iterations", "metrics" (last row), "plot", "checkpoint", "wall_time_s"}``.

    Raises:
        ConfigError: see :func:`build_run`. KeyboardInterrupt: after the checkpoint is saved.
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
    from drmas_train.distributed.cluster import DistributedError
    from drmas_train.run.metrics_log import batch_metrics, plot_run

    t_start = time.perf_counter()
    run = build_run(cfg, resume=resume, loader=loader, overwrite=overwrite)
    guard.attach(run)
    r, ckpt, metrics = cfg.rollout, None, {}
    bar = tqdm(desc="train", unit="iter", disable=not cfg.run.progress, initial=run.start_iteration, total=cfg.run.iterations)
    if cfg.eval.every > 0 and cfg.eval.before_train and run.start_iteration == 0:
        first = _validate(run, 0)  # the initial weights, as the reference's val_before_train
        run.logger.log(0, first)
        logger.info("%s", _validation_line(0, first))
    it = run.start_iteration
    while it < cfg.run.iterations:
        seed = cfg.seed * 1_000_003 + it  # per-iteration seed: a resumed run replays the same draws
        t0 = time.perf_counter()
        tasks = [run.tasks[i] for i in run.sampler.next_batch()]
        sampling = SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens)
        result = rollout(run.env_fn, tasks, r.group_size, run.pool, sampling, seed=seed,
                         max_prompt_tokens=r.max_prompt_tokens, truncation=r.truncation, progress=cfg.run.progress)  # fmt: skip
        greedy = _greedy_baseline(run, tasks, result, seed)  # ReMax only, else None
        guard.hold(f"iteration {it + 1}")  # from here to the checkpoint, Ctrl-C waits for the iteration to finish
        if cfg.run.save_samples:
            save_samples(result.samples, run.run_dir / "samples" / f"iter_{it + 1:06d}.jsonl")
        t1 = time.perf_counter()
        adv = compute_advantages(cfg, result.samples, greedy.samples if greedy is not None else None)  # (B,)
        metrics = batch_metrics(result.samples, adv)
        if greedy is not None:
            metrics["rollout/greedy_score_mean"] = float(np.mean([t.score for t in greedy.trajectories]))
        try:
            metrics.update(_update_models(run, result.samples, adv, seed))
        except DistributedError as err:  # a training rank died: rewind to the last checkpoint (bounded) or stop
            it = _rewind(run, run.updater.recover(err))
            logger.warning("training rank lost: %s; restarted from checkpoint iteration %d", err, it)
            bar.n = it
            guard.release(it)
            continue
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
            ckpt = _save(run, it + 1)
        it += 1
        bar.update(1)
        guard.release(it)  # iteration complete; a Ctrl-C received meanwhile raises here
    bar.close()
    run.logger.close()
    plot = plot_run(run.logger.path, run.run_dir / "training_curves.png") if cfg.run.plot and run.logger.path.is_file() else None
    summary = {"run_dir": str(run.run_dir), "iterations": cfg.run.iterations, "metrics": metrics,
               "plot": str(plot) if plot else None, "checkpoint": str(ckpt) if ckpt else None,
               "wall_time_s": time.perf_counter() - t_start}  # fmt: skip
    (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _rewind(run: RunState, state: dict[str, Any]) -> int:
    """Put the sampler and the metrics log back to a checkpoint's trainer state; returns its iteration."""
    from drmas_train.run.metrics_log import MetricsLogger

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
