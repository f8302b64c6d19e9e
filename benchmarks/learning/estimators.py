"""Advantage estimators side by side on the math quickstart: each ``quickstart_math_<estimator>`` preset x N seeds,
every one a real ``drmas train`` run, ranked on one leaderboard page written by ``drmas leaderboard``.

The presets (``drmas_train/configs/quickstart_math*.yaml``) are the README's main job (``quickstart_math``, Dr. MAS)
with only the estimator's keys changed: one per estimator of the registry
(``drmas_train.algorithm.advantages.ESTIMATORS``), each with its default grouping, plus Dr. GRPO (GRPO without the
std division and with the length-unbiased loss). Grouping is one key away: append ``algorithm.grouping=prompt_agent``
to give every group-baseline preset a per-agent baseline (e.g. RLOO per agent; ``reinforce_pp`` and ``gae`` have
no groups and refuse it). A run differs from its preset only in
``seed`` (training tasks, held-out tasks, sampling), ``run.dir``, ``run.num_threads`` (``--threads``) and, for
smoke runs, ``run.iterations`` (``--iterations``); dotted overrides after the options apply to every run.

Per run (``<runs>/<preset>/seed_<s>/``, its log next to it as ``seed_<s>.log``) the script keeps
``benchmark_run.json``: the held-out avg@k before training and after the last iteration and their paired gain
(the trainer's ``val/avg@k_gain`` ± its standard error over tasks), the pre-clip gradient norm of each trained model
(mean and max over iterations of ``loss/<model>/grad_norm``; the quickstart's Solver and Verifier share one model),
each agent's part of it (mean over iterations of ``agent/<agent>/grad_norm``, the exact per-agent split of the
shared model's gradient, docs/agent-health.md), each agent's advantage RMS
(``sqrt(mean^2 + std^2)`` of ``adv/<agent>/*``: the factor by which its policy-gradient norm scales, Dr. MAS arXiv
2602.08847 Prop. 4.3, docs/stability.md), the critic's value loss and explained variance at the first and last
iteration (``gae``), the final per-task validation scores, wall time of ``train()`` (model load, validations and
checkpoints included), peak RSS and the 1-minute load average at start and end. A finished run (its ``benchmark_run.json`` for the same preset,
seed and overrides) is reused, so an interrupted benchmark continues where it stopped (``--rerun`` re-runs); a
run stopped after one of its checkpoints (``run.save_every``) continues from it (:func:`resume_point`).
Checkpoints are deleted after each run (SmolLM2's weights + AdamW state: ~1.6 GB each) unless
``--keep-checkpoints``.

Outputs under ``--out`` (default ``benchmarks/learning/estimators/``):

* ``results.json``: every run's record, per preset the mean ± standard error over seeds (sample std, ddof 1, over
  sqrt(seeds)) of each figure, the machine (cores, load) and the benchmark's wall time. Presets measured by
  separate invocations (sessions) into the same ``--out`` end in one file (:func:`merge_results`): a preset run
  again replaces its earlier runs, the others are kept. An ``--out`` whose ``results.json`` used other seeds,
  iterations or overrides is refused (exit 2) before any run starts;
* ``results/<preset>/summary.json`` (+ an empty ``episodes.jsonl``): a results directory in the schema
  ``drmas leaderboard`` reads (docs/results-schema.md). Its ``metrics`` cell is the final held-out validation of
  all seeds pooled (tasks of different seeds are different tasks; avg@k and unbiased pass@k from the per-task
  scores, so no ``reward``/``any_of_k``/``agents`` keys and no episode rows); its ``run_metrics`` are the
  seed means ± standard errors above;
* ``leaderboard.{md,html,json}`` and ``leaderboard_<suite>.png`` from ``drmas leaderboard results --out .``.

It prints one JSON object: per preset the seed means, the failed runs (if any), the paths written, the wall time and
the load. Exit code 1 when a run failed (the others are kept and ranked), 2 for a bad preset or override.

    python benchmarks/learning/estimators.py                                  # every preset x 3 seeds (hours on 2 cores)
    python benchmarks/learning/estimators.py --presets quickstart_math quickstart_math_grpo --seeds 5 --jobs 2
    python benchmarks/learning/estimators.py --presets quickstart_math_rloo --seeds 1 --iterations 3 \\
        --out runs/estimators_smoke                                           # a smoke run
    python benchmarks/learning/estimators.py --presets quickstart_math_grpo quickstart_math_rloo \
        algorithm.grouping=prompt_agent --out runs/estimators_per_agent     # grouping, one key away

``--finished-only`` trains nothing: it writes the results of the runs already finished (a benchmark stopped
part-way, e.g. to commit what a session measured) and lists the others as ``missing``.

Arguments with ``=`` are overrides wherever they stand. The quickstart took 8-36 minutes per run on 2 CPU cores
(docs/quickstart.md; ``gae`` 30-36): the 12 presets x 3 seeds took 11.4 hours of run time in all. ``--jobs 2`` runs two at a time (one torch thread each with ``--threads 1``); on a 2-core machine
that other jobs also use, each run is then slower.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import multiprocessing
import os
import resource
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: one preset per estimator of the registry (``quickstart_math`` is the ``drmas`` one), plus Dr. GRPO.
PRESETS: tuple[str, ...] = (
    "quickstart_math",
    "quickstart_math_grpo",
    "quickstart_math_dr_grpo",
    "quickstart_math_grpo_step",
    "quickstart_math_per_turn",
    "quickstart_math_rloo",
    "quickstart_math_reinforce_pp_baseline",
    "quickstart_math_reinforce_pp",
    "quickstart_math_grpo_passk",
    "quickstart_math_gigpo",
    "quickstart_math_remax",
    "quickstart_math_gae",
)
RECORD = "benchmark_run.json"


def _quickstart() -> Any:
    """``benchmarks/learning/quickstart.py`` (its :func:`summarize` reads a run's validations)."""
    spec = importlib.util.spec_from_file_location("drmas_bench_quickstart", HERE / "quickstart.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _finite(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def _names(rows: Sequence[dict], prefix: str, suffix: str) -> list[str]:
    """The ``<name>`` of every ``<prefix><name><suffix>`` key in ``rows`` (sorted), e.g. models of loss/*/grad_norm."""
    return sorted({k[len(prefix) : -len(suffix)] for r in rows for k in r if k.startswith(prefix) and k.endswith(suffix)
                   and "/" not in k[len(prefix) : -len(suffix)]})  # fmt: skip


def _first_last(rows: Sequence[dict], key: str) -> dict[str, float] | None:
    vals = [r[key] for r in rows if key in r and r[key] is not None and math.isfinite(r[key])]
    return {"first": float(vals[0]), "last": float(vals[-1])} if vals else None


def _game_gain(rows: Sequence[dict]) -> dict[str, Any] | None:
    """A game run's outcome (the validations against its first opponent): ``outcome`` ("return vs <opponent>"),
    and for its first and last validation rows ``return`` (pooled over the learning seats) and ``stderr``, and for
    the last ``gain``, the return gain averaged over the roles with equal weight
    (:func:`drmas_train.eval.game_metrics.role_return_gain`), with ``gain_stderr`` the trainer's paired standard
    error of the pooled gain (``val/<opponent>/return_gain_se``: the same number when the seats are balanced). None
    for a run without game validations."""
    from drmas_train.eval.game_metrics import role_return_gain

    val = [r for r in rows if any(k.endswith("/all/return") and k.startswith("val/") for k in r)]
    if len(val) < 2:
        return None
    opponent = next(k[len("val/"):-len("/all/return")] for k in val[0] if k.startswith("val/") and k.endswith("/all/return"))
    p = f"val/{opponent}"

    def row(r: dict) -> dict[str, Any]:
        return {"return": r[f"{p}/all/return"], "stderr": r.get(f"{p}/all/return_se")}

    last = {**row(val[-1]), "gain": role_return_gain(val[0], val[-1], p)["gain"],
            "gain_stderr": val[-1].get(f"{p}/return_gain_se")}  # fmt: skip
    return {"outcome": f"return vs {opponent}", "first": row(val[0]), "last": last}


def run_record(rows: Sequence[dict]) -> dict[str, Any]:
    """The benchmark's figures of one training run, from its ``metrics.jsonl`` rows.

    Returns:
        ``k``; ``outcome`` (what ``initial``, ``final`` and ``gain`` measure: ``held-out avg@k``, or for a game
        ``return vs <opponent>``, :func:`_game_gain`); ``initial`` / ``final`` (held-out avg@k, or a game's return
        against its first validation opponent, at iteration 0 and at the last validation), ``final_stderr``,
        ``gain`` / ``gain_stderr`` (the trainer's paired gain over the same tasks and its standard error over tasks;
        a game's return gain averaged over its roles),
        ``final_iteration``; ``grad_norm`` / ``grad_norm_max`` (model -> mean of ``loss/<model>/grad_norm`` over the
        iterations, max of ``loss/<model>/grad_norm_max``); ``agent_grad_norm`` (agent -> mean over iterations of
        ``agent/<agent>/grad_norm``, its part of its model's gradient); ``adv_rms`` (agent -> mean over iterations of
        ``sqrt(adv mean^2 + adv std^2)``); ``valid_action_ratio`` (agent -> last iteration's); ``train_accuracy``
        (mean over iterations); ``critic`` (``vf_loss/<critic>`` and ``explained_variance/<agent>`` -> first and
        last iteration's value; empty without a critic).

    Raises:
        ValueError: the run has no validation of its initial weights and of its last ones (the gain needs
            ``eval.before_train: true`` and ``eval.every > 0``).
    """
    validation = _quickstart().summarize(list(rows))["validation"]
    first, last = validation[0], validation[-1]
    game = _game_gain(rows)
    if game is not None and first["iteration"] == 0 and last["iteration"] > 0:
        first, last = {**first, **game["first"]}, {**last, **game["last"]}
    if first["iteration"] != 0 or "gain" not in last:
        raise ValueError("the gain needs a validation at iteration 0 (eval.before_train=true) and one after training; "
                         f"validated iterations: {[v['iteration'] for v in validation]}")  # fmt: skip
    key = next(k for k in first if k.startswith("avg@"))
    train_rows = [r for r in rows if r.get("iteration", 0) > 0]
    grad = {
        m: _finite([r.get(f"loss/{m}/grad_norm") for r in train_rows])
        for m in _names(rows, "loss/", "/grad_norm")
    }
    grad_max = {m: _finite([r.get(f"loss/{m}/grad_norm_max") for r in train_rows]) for m in grad}
    agents = _names(rows, "adv/", "/std")
    agent_grad = {a: _finite([r.get(f"agent/{a}/grad_norm") for r in train_rows]) for a in _names(rows, "agent/", "/grad_norm")}
    rms = {
        a: [math.hypot(r[f"adv/{a}/mean"], r[f"adv/{a}/std"]) for r in train_rows if f"adv/{a}/std" in r]
        for a in agents
    }
    critic: dict[str, dict[str, float]] = {}
    for c in _names(rows, "critic/", "/vf_loss"):
        critic[f"vf_loss/{c}"] = _first_last(train_rows, f"critic/{c}/vf_loss")
    for a in _names(rows, "critic/", "/explained_variance"):
        critic[f"explained_variance/{a}"] = _first_last(train_rows, f"critic/{a}/explained_variance")
    ratio = {a: [r[f"reward/{a}/valid_action_ratio"] for r in train_rows if f"reward/{a}/valid_action_ratio" in r]
             for a in agents}  # fmt: skip
    acc = _finite([r.get("rollout/accuracy") for r in train_rows])
    return {
        "k": int(key[len("avg@") :]),
        "outcome": game["outcome"] if game is not None else f"held-out {key}",
        "initial": first.get("return", first[key]),
        "final": last.get("return", last[key]),
        "final_stderr": last["stderr"],
        "gain": last["gain"],
        "gain_stderr": last["gain_stderr"],
        "final_iteration": last["iteration"],
        "grad_norm": {m: sum(v) / len(v) for m, v in grad.items() if v},
        "grad_norm_max": {m: max(v) for m, v in grad_max.items() if v},
        "agent_grad_norm": {a: sum(v) / len(v) for a, v in agent_grad.items() if v},
        "adv_rms": {a: sum(v) / len(v) for a, v in rms.items() if v},
        "valid_action_ratio": {a: v[-1] for a, v in ratio.items() if v},
        "train_accuracy": sum(acc) / len(acc) if acc else None,
        "critic": {k: v for k, v in critic.items() if v is not None},
    }


def pooled_cell(score_sets: Sequence[dict[str, float]], k: int) -> dict[str, Any]:
    """A leaderboard metrics cell (docs/results-schema.md) of held-out validations pooled over runs.

    Args:
        score_sets: per run, task id -> the task's score (correct samples / k) from ``validation/iter_<N>.json``.
            Tasks of different runs count as different tasks (another seed validates on other problems).
        k: samples per task.

    Returns:
        ``num_tasks``, ``num_episodes``, ``samples_per_task``, ``avg@k`` (mean over tasks of the scores, with its
        standard error over tasks) and ``pass@k`` (unbiased, Chen et al. 2021, for the powers of two up to k and k,
        from each task's ``(k, round(score * k))``); the keys that need episode rows are absent.

    Raises:
        ValueError: no task, or a score that is not a multiple of 1/k in [0, 1].
    """
    from drmas_train.eval.metrics import default_k_values, mean_stderr, pass_at_k_tasks

    scores = [float(s) for run in score_sets for s in run.values()]
    if not scores:
        raise ValueError("no validation task to pool")
    counts = []
    for s in scores:
        c = round(s * k)
        if not 0 <= c <= k or abs(c - s * k) > 1e-6:
            raise ValueError(f"a task score {s} is not a share of k={k} samples")
        counts.append((k, c))
    return {
        "num_tasks": len(scores),
        "num_episodes": len(scores) * k,
        "samples_per_task": k,
        "avg@k": mean_stderr(scores).to_dict(),
        "pass@k": {str(j): pass_at_k_tasks(counts, j).to_dict() for j in default_k_values(k)},
    }


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± standard error over the runs (seeds) of one preset.

    Returns:
        ``seeds``, and ``{"value", "stderr", "n"}`` estimates (stderr null for one seed) of ``gain``, ``initial``,
        ``final``, ``wall_time_s``, ``load_start``, per model ``grad_norm`` / ``grad_norm_max``, per agent
        ``agent_grad_norm`` and ``adv_rms``, per critic metric ``critic/<name>/first|last``; ``peak_rss_gb`` (the largest).

    Raises:
        ValueError: no records.
    """
    from drmas_train.eval.metrics import mean_stderr

    if not records:
        raise ValueError("no finished run to aggregate")

    def est(values: Sequence[float]) -> dict[str, Any] | None:
        vals = _finite(values)
        return mean_stderr(vals).to_dict() if vals else None

    out: dict[str, Any] = {"seeds": sorted(r["seed"] for r in records)}
    for key in ("gain", "initial", "final", "wall_time_s", "load_start"):
        out[key] = est([r[key] for r in records])
    for group in ("grad_norm", "grad_norm_max", "agent_grad_norm", "adv_rms"):
        names = sorted({n for r in records for n in r.get(group, {})})
        out[group] = {n: est([r.get(group, {}).get(n) for r in records]) for n in names}
    names = sorted({n for r in records for n in r["critic"]})
    out["critic"] = {f"{n}/{end}": est([r["critic"].get(n, {}).get(end) for r in records])
                     for n in names for end in ("first", "last")}  # fmt: skip
    out["peak_rss_gb"] = max((r["peak_rss_gb"] for r in records if r["peak_rss_gb"] is not None), default=None)
    return out


def run_metrics(agg: dict[str, Any], k: int) -> dict[str, dict[str, Any]]:
    """The leaderboard's ``run_metrics`` of a preset (:func:`aggregate`'s estimates, named with their units)."""
    out = {f"held-out gain avg@{k}": agg["gain"], f"final avg@{k} (seed mean)": agg["final"]}
    out.update({f"grad norm {m}": v for m, v in agg["grad_norm"].items()})
    out.update({f"grad norm max {m}": v for m, v in agg["grad_norm_max"].items()})
    out.update({f"grad norm agent {a}": v for a, v in agg.get("agent_grad_norm", {}).items()})
    out.update({f"adv RMS {a}": v for a, v in agg["adv_rms"].items()})
    for name, v in agg["critic"].items():  # vf_loss/<critic>/first -> "value loss <critic> first"
        kind, who, end = name.split("/")
        out[f"{'value loss' if kind == 'vf_loss' else 'explained var'} {who} {end}"] = v
    wall = agg["wall_time_s"]
    out["wall time min"] = {
        "value": wall["value"] / 60,
        "stderr": wall["stderr"] and wall["stderr"] / 60,
        "n": wall["n"],
    }
    out["load at start"] = agg["load_start"]
    n = len(agg["seeds"])
    out["seeds"] = {"value": n, "stderr": None, "n": n}
    return {name: v for name, v in out.items() if v is not None}


# ---------------------------------------------------------------- one run (in a fresh process)


def _train_one(job: dict[str, Any]) -> dict[str, Any]:
    """Train ``job["preset"]`` with ``job["overrides"]`` (in a spawned process) and write its record."""
    os.environ["OMP_NUM_THREADS"] = str(job["threads"])  # before torch loads in this process
    import logging

    from drmas_train.run.checkpoint import checkpoint_iteration
    from drmas_train.run.config import load_config
    from drmas_train.run.trainer import train

    run_dir = Path(job["run_dir"])
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(job["log"], mode="w", encoding="utf-8")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(message)s", handlers=[handler], force=True
    )
    # what `drmas train` prints: per-iteration summaries, validations
    for name in ("drmas_train", "drmas_envs"):
        logging.getLogger(name).setLevel(logging.INFO)
    cfg = load_config(job["preset"], job["overrides"])
    ckpt = resume_point(run_dir, cfg)
    earlier_s = _checkpoint_elapsed(ckpt) if ckpt is not None else 0.0
    load_start = os.getloadavg()[0]
    t0 = time.perf_counter()
    if ckpt is not None:  # an earlier attempt of this very run stopped after a checkpoint: continue it exactly
        train(cfg, resume=True)
    else:
        train(cfg, overwrite=True)  # an unfinished earlier attempt without a checkpoint of this config is replaced
    wall = time.perf_counter() - t0 + earlier_s
    resumed = {"resumed_from": checkpoint_iteration(ckpt)} if ckpt is not None else {}
    record = write_record(job, cfg, wall_time_s=round(wall, 1), load_start=load_start, load_end=os.getloadavg()[0],
                          peak_rss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                          **resumed)  # fmt: skip
    handler.close()
    return record


def resume_point(run_dir: Path, cfg: Any) -> Path | None:
    """The checkpoint an unfinished earlier attempt of this run left in ``run_dir`` (its latest, before
    ``run.iterations``), if its resolved config is this run's exactly (``config.yaml`` = ``to_yaml(cfg)``: same preset, seed, threads, overrides); else
    None (no checkpoint, or one of another config: that attempt is replaced). ``drmas train --resume`` continues
    a run exactly (the sampler, RNG and weights of the checkpoint), so a resumed run's record is the uninterrupted
    run's; its ``wall_time_s`` adds the trainer's time at the checkpoint to this process's (the earlier process's
    model loading left out) and ``resumed_from`` names the checkpoint's iteration."""
    from drmas_train.run.checkpoint import checkpoint_iteration, latest_checkpoint
    from drmas_train.run.config import to_yaml

    ckpt = latest_checkpoint(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else None
    if ckpt is None or not (ckpt / "config.yaml").is_file() or checkpoint_iteration(ckpt) >= cfg.run.iterations:
        return None  # nothing to continue (a finished run's, kept by --keep-checkpoints, is trained again: --rerun)
    return ckpt if (ckpt / "config.yaml").read_text() == to_yaml(cfg) else None


def _checkpoint_elapsed(ckpt: Path) -> float:
    """The trainer's wall-clock seconds at checkpoint ``ckpt`` (``extra.elapsed_s`` of its ``trainer_state.pt``)."""
    import torch

    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    return float(state["extra"].get("elapsed_s", 0.0))


def write_record(job: dict[str, Any], cfg: Any, **measured: Any) -> dict[str, Any]:
    """Write ``job``'s record (:data:`RECORD`) from its finished run directory and return it: the run's config
    (``cfg``), :func:`run_record` of its metrics, the final validation's per-task scores, and ``measured``
    (``wall_time_s``, ``load_start``, ``load_end``, ``peak_rss_gb``, and any note). Deletes the run's checkpoints
    unless ``job["keep_checkpoints"]``.

    Raises:
        FileNotFoundError: the run has no metrics or no final validation.
    """
    from drmas_train.model.adapters import split_model_id
    from drmas_train.run.metrics_log import read_metrics

    run_dir = Path(job["run_dir"])
    record = {"job": _job_key(job), "preset": job["preset"], "seed": job["seed"], "run_dir": job["run_dir"],
              "estimator": cfg.algorithm.estimator, "grouping": cfg.algorithm.grouping, "env_id": cfg.env.id,
              "agent_models": {a: cfg.models[split_model_id(m)[0]].name_or_path for a, m in cfg.agents.items()},
              "sampling": {"temperature": cfg.eval.temperature, "top_p": cfg.eval.top_p, "top_k": cfg.eval.top_k,
                           "max_new_tokens": cfg.rollout.max_new_tokens},
              **run_record(read_metrics(run_dir / "metrics.jsonl"))}  # fmt: skip
    final = json.loads((run_dir / "validation" / f"iter_{record['final_iteration']:06d}.json").read_text())
    record["final_scores"] = final["scores"]
    record["data_source"] = _data_source(cfg)
    record.update(threads=job["threads"], **measured)
    if not job["keep_checkpoints"]:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    (run_dir / RECORD).write_text(json.dumps(record, indent=1))
    return record


def record_finished(job: dict[str, Any]) -> dict[str, Any] | None:
    """The record of a run that finished training but whose record was never written (the benchmark stopped, or
    its record step failed): written from the run directory when its ``summary.json`` covers every configured
    iteration, else None. What only the training process could measure is left out: ``wall_time_s`` is the
    trainer's own (``summary.json``), ``load_start``, ``load_end`` and ``peak_rss_gb`` are None, and
    ``recorded_after_the_run`` is True."""
    from drmas_train.run.config import load_config

    summary = Path(job["run_dir"]) / "summary.json"
    cfg = load_config(job["preset"], job["overrides"])
    if not summary.is_file():
        return None
    done = json.loads(summary.read_text())
    if done.get("iterations") != cfg.run.iterations or str(cfg.run.iterations) not in done.get("validation", {}):
        return None
    return write_record(job, cfg, wall_time_s=round(float(done["wall_time_s"]), 1), load_start=None, load_end=None,
                        peak_rss_gb=None, recorded_after_the_run=True)  # fmt: skip


def _data_source(cfg: Any) -> str:
    """The ``data_source`` of the run's held-out tasks (their first task's), the leaderboard's column."""
    from drmas_train.run.env_setup import load_env_tasks

    spec = cfg.eval.data or cfg.env.data
    key = "eval.data" if cfg.eval.data else "env.data"
    tasks = load_env_tasks(cfg, spec, key=key, seed=cfg.seed + 10_000, size=1) if spec else None
    return tasks[0].data_source if tasks is not None and len(tasks) else "held-out"


def _job_key(job: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run (a finished one with this key is reused)."""
    return {"preset": job["preset"], "seed": job["seed"], "overrides": job["overrides"]}


# ---------------------------------------------------------------- the benchmark


def _summary_json(
    preset: str, records: list[dict[str, Any]], agg: dict[str, Any], args: argparse.Namespace
) -> dict:
    """``results/<preset>/summary.json`` for ``drmas leaderboard`` (docs/results-schema.md, plus ``run_metrics``)."""
    from drmas_train import __version__
    from drmas_train.eval.results import config_hash, env_version, git_commit

    first = records[0]
    k = first["k"]
    cell = pooled_cell([r["final_scores"] for r in records], k)
    config = {"benchmark": "benchmarks/learning/estimators.py", "preset": preset, "estimator": first["estimator"],
              "grouping": first["grouping"], "seeds": agg["seeds"], "iterations": args.iterations,
              "overrides": args.overrides, "threads": args.threads}  # fmt: skip
    label = preset if preset.endswith(first["estimator"]) else f"{preset} ({first['estimator']})"
    return {
        "run_id": config_hash(config)[:12],
        "label": label,
        "drmas_version": __version__,
        "git_commit": git_commit(),
        "config": config,
        "config_hash": config_hash(config),
        "policy": "llm",
        "agent_models": first["agent_models"],
        "envs": [{"env_id": first["env_id"], "version": env_version(first["env_id"])}],
        "data": [first["data_source"]],
        "k": k,
        "sampling": first["sampling"],
        "seed": agg["seeds"][0],
        "num_episodes": 0,  # no episode rows: the cells come from the trainer's per-task validation scores
        "wall_time_s": sum(r["wall_time_s"] for r in records),
        "metrics": {first["env_id"]: {first["data_source"]: cell, "overall": cell}},
        "run_metrics": run_metrics(agg, k),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--presets",
        nargs="+",
        default=list(PRESETS),
        metavar="PRESET",
        help="presets or YAML files (default: one per estimator, %(default)s)",
    )
    p.add_argument("--seeds", type=int, default=3, help="N seeds per preset (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="seeds FIRST..FIRST+N-1 (default 0)")
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="override run.iterations (smoke runs); default: the preset's",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads per run (run.num_threads; default 1)"
    )
    p.add_argument(
        "--jobs", type=int, default=1, help="runs at a time (default 1; 2 on an idle 2-core machine)"
    )
    p.add_argument(
        "--runs", default="runs/estimators", help="where the training runs go (default runs/estimators)"
    )
    p.add_argument(
        "--out",
        default=str(HERE / "estimators"),
        help="leaderboard and results (default benchmarks/learning/estimators)",
    )
    p.add_argument("--title", default=None, help="leaderboard title")
    p.add_argument("--record-finished", action="store_true",
                   help="write the missing record of a run that finished training (its record step failed or never "
                        "ran) from its run directory instead of training it again; its load and peak RSS are unknown")  # fmt: skip
    p.add_argument(
        "--rerun", action="store_true", help="re-run finished runs instead of reusing their records"
    )
    p.add_argument("--finished-only", action="store_true",
                   help="train nothing: write the results of the runs already finished, list the others as missing")  # fmt: skip
    p.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep each run's final checkpoint (~1.6 GB for SmolLM2)",
    )
    p.add_argument("overrides", nargs="*", help="dotted overrides applied to every run, as drmas train")  # fmt: skip
    return p


#: what one results.json holds the same for every run
DESIGN_KEYS = ("seeds", "first_seed", "iterations", "overrides")


def check_mergeable(earlier: Mapping[str, Any], design: Mapping[str, Any]) -> None:
    """Whether runs of ``design`` (this invocation's :data:`DESIGN_KEYS`) can join ``earlier`` (a ``results.json``
    already in ``--out``) in one file; checked before any run starts (see :func:`merge_results`).

    Raises:
        ValueError: ``earlier`` is not this script's (no ``runs`` list or ``presets``), or it used other seeds,
            iterations or overrides.
    """
    if not isinstance(earlier.get("runs"), list) or not isinstance(earlier.get("presets"), dict):
        raise ValueError("the results.json already in --out is not an estimators.py one (no 'runs' and 'presets'): "
                         "move it away or pick another --out")  # fmt: skip
    for key in DESIGN_KEYS:
        if earlier.get(key) != design.get(key):
            raise ValueError(f"the results.json already in --out used {key}={earlier.get(key)!r}, this run "
                             f"{design.get(key)!r}: one results.json holds one design; pick another --out")  # fmt: skip


def merge_runs(earlier: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run records of ``earlier`` and ``new`` keyed by (preset, seed), ``new``'s winning; sorted by that key."""
    runs = {(r["preset"], r["seed"]): dict(r) for r in earlier}
    runs.update({(r["preset"], r["seed"]): dict(r) for r in new})
    return [runs[key] for key in sorted(runs)]


def merge_results(earlier: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` (this invocation's ``results.json``) plus what ``earlier`` (the same folder's previous one) holds:
    runs merged by (preset, seed) (:func:`merge_runs`: a run measured again replaces its earlier record, the others
    are kept, so presets and seeds measured in separate sessions end in one file), failures of runs that have no
    record, and the seed aggregates (``new``'s for its presets, which it computed from the merged runs; ``earlier``'s
    for the others). ``earlier_presets`` lists the presets whose aggregates were kept from ``earlier``. Merging a
    file into itself changes nothing. The top-level ``wall_time_s``, ``machine``, ``jobs`` and ``threads`` stay
    this invocation's; every run's record keeps its own wall time and load.

    Raises:
        ValueError: as :func:`check_mergeable`.
    """
    check_mergeable(earlier, {k: new.get(k) for k in DESIGN_KEYS})
    merged = dict(new)
    kept = {p: a for p, a in earlier["presets"].items() if p not in new["presets"]}
    every = {**kept, **new["presets"]}
    order = [p for p in PRESETS if p in every] + sorted(p for p in every if p not in PRESETS)
    merged["presets"] = {p: every[p] for p in order}
    merged["runs"] = merge_runs(earlier["runs"], new["runs"])
    recorded = {(r["preset"], r["seed"]) for r in merged["runs"]}
    failed = {(f.get("preset"), f.get("seed")): f for f in [*earlier.get("failed", []), *new.get("failed", [])]}
    merged["failed"] = [f for key, f in failed.items() if key not in recorded]
    merged["earlier_presets"] = sorted(set(kept) | set(new.get("earlier_presets", [])))
    return merged


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One job per preset x seed; raises ConfigError for a preset or override that does not load."""
    from drmas_train.run.config import load_config

    jobs = []
    for preset in args.presets:
        stem = Path(preset).stem
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            run_dir = Path(args.runs) / stem / f"seed_{seed}"
            overrides = [*args.overrides, f"seed={seed}", f"run.dir={run_dir}", "run.progress=false",
                         f"run.num_threads={args.threads}"]  # fmt: skip
            if args.iterations is not None:
                overrides.append(f"run.iterations={args.iterations}")
            if seed == args.first_seed:
                load_config(preset, overrides)  # every mistake before the first run starts
            jobs.append({"preset": preset, "seed": seed, "overrides": overrides, "run_dir": str(run_dir),
                         "log": str(run_dir.parent / f"seed_{seed}.log"), "threads": args.threads,
                         "keep_checkpoints": args.keep_checkpoints})  # fmt: skip
    return jobs


def _reusable(job: dict[str, Any]) -> dict[str, Any] | None:
    path = Path(job["run_dir"]) / RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if same_job(record.get("job"), _job_key(job)) else None


def same_job(recorded: Mapping[str, Any] | None, key: Mapping[str, Any]) -> bool:
    """Whether a record's job key is ``key``: the same preset, seed and overrides, a ``run.dir=`` override compared
    as the directory it names (``--runs runs/x`` from the repository and ``--runs /abs/repo/runs/x`` are one run)."""

    def canonical(k: Mapping[str, Any]) -> dict[str, Any]:
        overrides = [f"run.dir={Path(o.removeprefix('run.dir=')).resolve()}" if o.startswith("run.dir=") else o
                     for o in k.get("overrides", [])]  # fmt: skip
        return {**k, "overrides": overrides}

    return recorded is not None and canonical(recorded) == canonical(key)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options; an argument with ``=`` is an override even after ``--presets`` (whose list would swallow it)."""
    args = _parser().parse_args(argv)
    args.overrides = [*args.overrides, *(p for p in args.presets if "=" in p)]
    args.presets = [p for p in args.presets if "=" not in p]
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code (0 ok, 1 a run failed, 2 bad arguments)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from drmas_train.commands import leaderboard
    from drmas_train.eval.results import write_run
    from drmas_train.run.config import ConfigError

    if (
        args.seeds < 1
        or args.jobs < 1
        or args.threads < 1
        or args.first_seed < 0
        or (args.iterations is not None and args.iterations < 1)
    ):
        print("estimators.py: --seeds, --jobs, --threads and --iterations must be >= 1, --first-seed >= 0", file=sys.stderr)
        return 2
    if args.rerun and args.finished_only:
        print("estimators.py: --rerun trains every run again, --finished-only trains none: pick one", file=sys.stderr)
        return 2
    out = Path(args.out)
    # presets and seeds measured by an earlier invocation into the same folder are kept (merge_results)
    earlier = json.loads((out / "results.json").read_text()) if (out / "results.json").is_file() else None
    try:
        if earlier is not None:
            check_mergeable(earlier, {key: getattr(args, key) for key in DESIGN_KEYS})
        jobs = _jobs(args)
    except (ConfigError, ValueError) as err:
        print(f"estimators.py: {err}", file=sys.stderr)
        return 2
    load_start, t0 = os.getloadavg(), time.perf_counter()
    records: list[dict[str, Any]] = []
    todo = []
    for job in jobs:
        done = None if args.rerun else _reusable(job) or (record_finished(job) if args.record_finished else None)
        (records.append(done) if done else todo.append(job))
    missing = [{"preset": j["preset"], "seed": j["seed"]} for j in todo] if args.finished_only else []
    todo = [] if args.finished_only else todo
    failed = []
    extra = {"max_tasks_per_child": 1} if sys.version_info >= (3, 11) else {}  # a fresh process per run
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"), **extra) as pool:
        futures = {pool.submit(_train_one, job): job for job in todo}
        for fut in as_completed(futures):
            job = futures[fut]
            try:
                rec = fut.result()
            except Exception as err:  # noqa: BLE001 - one broken run must not lose the others
                failed.append({"preset": job["preset"], "seed": job["seed"], "error": f"{type(err).__name__}: {err}",
                               "log": job["log"]})  # fmt: skip
                print(
                    f"FAILED {job['preset']} seed {job['seed']}: {err} (log: {job['log']})", file=sys.stderr
                )
                continue
            records.append(rec)
            print(f"done {rec['preset']} seed {rec['seed']}: avg@{rec['k']} {rec['initial']:.3f} -> {rec['final']:.3f}"
                  f" (gain {rec['gain']:+.3f} ± {rec['gain_stderr']:.3f}), {rec['wall_time_s']:.0f} s", file=sys.stderr)  # fmt: skip
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    if earlier is not None:  # the seeds of this invocation's presets that an earlier one recorded count too
        records = merge_runs([r for r in earlier["runs"] if r["preset"] in args.presets], records)
    presets: dict[str, Any] = {}
    for preset in args.presets:
        # this preset's folder is regenerated from its records; other presets' folders in --out (an earlier
        # invocation's, e.g. another setting of benchmarks/paper_effect) stay, and the leaderboard ranks them all
        shutil.rmtree(out / "results" / Path(preset).stem, ignore_errors=True)
        recs = sorted((r for r in records if r["preset"] == preset), key=lambda r: r["seed"])
        if not recs:
            continue
        agg = presets[preset] = aggregate(recs)
        summary = _summary_json(preset, recs, agg, args)
        write_run(out / "results" / Path(preset).stem, summary, [])
    machine = {"cores": len(os.sched_getaffinity(0)), "load_start": load_start, "load_end": os.getloadavg()}
    result = {"presets": presets, "failed": failed, "seeds": args.seeds, "first_seed": args.first_seed,
              "iterations": args.iterations,
              "overrides": args.overrides, "threads": args.threads, "jobs": args.jobs, "wall_time_s": round(wall, 1),
              "machine": machine}  # fmt: skip
    saved = {**result, "runs": sorted(records, key=lambda r: (r["preset"], r["seed"]))}
    if earlier is not None:
        saved = merge_results(earlier, saved)
    (out / "results.json").write_text(json.dumps(saved, indent=1) + "\n")
    written: dict[str, str] = {"results": str(out / "results.json")}
    if presets:
        counts = sorted({len(a["seeds"]) for a in saved["presets"].values()})  # a benchmark still growing: uneven
        seeds = (f"{counts[0]} seed{'s' if counts[0] > 1 else ''}" if len(counts) == 1
                 else f"{counts[0]}-{counts[-1]} seeds (see the seeds column)")  # fmt: skip
        n_iter = "/".join(
            str(i) for i in sorted({r["final_iteration"] for r in saved["runs"]})
        )  # the last validation's
        iters = f"{n_iter} iteration{'' if n_iter == '1' else 's'}"
        title = args.title or (f"drmas advantage estimators on the math quickstart ({seeds} x {iters}"
                               f"{'; ' + ' '.join(args.overrides) if args.overrides else ''})")  # fmt: skip
        cwd = os.getcwd()
        os.chdir(out)  # so that the pages name results/<preset>, not a path of this machine
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout: the one JSON object
                code = leaderboard.main(["results", "--out", ".", "--title", title])
        finally:
            os.chdir(cwd)
        if code:
            return code
        written.update(markdown=str(out / "leaderboard.md"), html=str(out / "leaderboard.html"))
    brief = {
        p: {key: a[key] for key in ("seeds", "gain", "final", "wall_time_s")} for p, a in presets.items()
    }
    print(json.dumps({**result, "presets": brief, "missing": missing, "written": written}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
