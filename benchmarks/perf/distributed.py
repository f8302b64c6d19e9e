"""Distributed throughput on the CPU: the Ray path (1 and 2 workers per model) against the single-process path
at equal work — the same config, tasks, samples and advantages.

For each setup it times one iteration's rollout (lock-step, one batched generate call per model per step; with
2 workers each call is spread over 2 generation workers) and one PPO update on one fixed set of samples (with 2
ranks the micro-batches are split over 2 data-parallel ranks), repeated ``--repeats`` times (medians), plus the
one-off start-up of the worker groups. Prints one JSON object:

* ``setups.<name>``: ``startup_s``, ``rollout_s``, ``agent_calls_per_s``, ``gen_tokens_per_s``, ``update_s``,
  ``update_tokens_per_s`` (prompt + response tokens trained per second); on Ray also ``publish_s`` (median): the part
  of ``update_s`` that pushes the new weights to the generation engines (rank 0 gathers its full state dict into the
  object store, each engine loads it), which one process does not need (its engine samples from the trained model);
  and ``rank_update_s`` / ``rank_release_s`` (medians of ``dist/<model>/rank_update_s`` and ``.../rank_release_s``):
  the slowest rank's own seconds in the update (π_old and the PPO steps) and in releasing its freed memory after it;
  the rest of ``update_s`` is dispatch, the samples' transfer, the result's return and the push;
* ``ray_overhead``: ``(ray_1 - single) / single`` for rollout and update time (the cost of the actors, the object
  store and the weight push at equal work), ``update_without_publish`` (the same without the push) and
  ``inside_rank`` (``(rank_update_s - single update_s) / single update_s``: what the rank's process itself adds);
* ``speedup_2_vs_1``: ``ray_1 / ray_2`` time ratios;
* ``setups.ray_1_keep.vs_single``: the one-rank update with ``distributed.rank_host_memory=keep`` (the rank holds
  the memory it frees, as one process does) over the single process's: whole, without the push, inside the rank;
* ``rank_memory``: peak RSS of each of 2 data-parallel ranks (gloo, spawned without Ray) during one
  ``dp_ppo_update`` of a tiny Llama with a large vocabulary (``--rank-vocab``), with the plain full-logits
  forward (``lm_head_chunk=0``, no prompt sharing: what the ranks ran before) and with the lean forward the ranks
  run now (chunked LM head; shared prompts under DDP), for FSDP2 and DDP: ``peak_mb`` per rank and
  ``update_mb`` = peak minus the RSS just before the update (the update's own memory). ``--rank-memory-only``
  skips the Ray setups.

    python benchmarks/perf/distributed.py                               # tiny-qwen3, 4 tasks x G=4
    python benchmarks/perf/distributed.py --model tiny-llama --tasks 8 --group-size 4 --repeats 3
    python benchmarks/perf/distributed.py --rank-memory-only --rank-vocab 65536

Timings on a shared machine vary from run to run; compare setups from the same invocation only. Two workers only
pay off when there are two idle cores for them (a 2-core laptop also runs the driver).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

#: setup name -> its config overrides
SETUPS = {"single": (), "ray_1": ("distributed.enabled=true", "distributed.world_size.shared=1"),
          "ray_1_keep": ("distributed.enabled=true", "distributed.world_size.shared=1",
                         "distributed.rank_host_memory=keep"),
          "ray_2": ("distributed.enabled=true", "distributed.world_size.shared=2")}  # fmt: skip


def _config(args, run_dir: str, *extra: str):
    from drmas_train.run.config import load_config

    return load_config(None, [
        f"models.shared.name_or_path={args.model}", f"run.dir={run_dir}", "run.progress=false", "run.tensorboard=false",
        "run.plot=false", "run.num_threads=1", f"rollout.batch_size={args.tasks}", f"rollout.group_size={args.group_size}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"seed={args.seed}", *extra,
    ])  # fmt: skip


def _measure(run, args, fixed_samples=None) -> tuple[dict, list]:
    import numpy as np

    from drmas_train.backends.base import SamplingParams
    from drmas_train.collect.rollout import rollout

    r = run.cfg.rollout
    sampling = SamplingParams(temperature=r.temperature, max_new_tokens=r.max_new_tokens)
    tasks = [run.tasks[i] for i in range(args.tasks)]
    roll, upd, calls, tokens, samples = [], [], 0, 0, fixed_samples
    pushes: list[float] = []
    inside: dict[str, list[float]] = {"rank_update_s": [], "rank_release_s": []}  # Ray: the ranks' own seconds
    for group in getattr(run.updater, "groups", {}).values():  # Ray: time each weight push inside the update
        def timed(publish=group.publish) -> None:
            t = time.perf_counter()
            publish()
            pushes.append(time.perf_counter() - t)

        group.publish = timed
    for k in range(args.repeats):
        t0 = time.perf_counter()
        result = rollout(run.env_fn, tasks, r.group_size, run.pool, sampling, seed=args.seed + k,
                         max_prompt_tokens=r.max_prompt_tokens, progress=False)  # fmt: skip
        roll.append(time.perf_counter() - t0)
        calls, tokens = len(result.samples), sum(len(s.response_ids) for s in result.samples)
        samples = samples or result.samples  # every setup updates on the first setup's samples: equal work
        adv = np.random.default_rng(k).normal(size=len(samples))  # non-zero: no sample is skipped
        t0 = time.perf_counter()
        metrics = run.updater.update(samples, adv, k)
        upd.append(time.perf_counter() - t0)
        for key, values in inside.items():
            values.extend(v for name, v in metrics.items() if name.startswith("dist/") and name.endswith(f"/{key}"))
    trained = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    rollout_s, update_s = statistics.median(roll), statistics.median(upd)
    return {"rollout_s": round(rollout_s, 3), "rollout_s_runs": [round(x, 3) for x in roll],
            "agent_calls_per_s": round(calls / rollout_s, 2), "gen_tokens_per_s": round(tokens / rollout_s, 1),
            "update_s": round(update_s, 3), "update_s_runs": [round(x, 3) for x in upd],
            "update_tokens_per_s": round(trained / update_s, 1),
            **({"publish_s": round(statistics.median(pushes), 3), "publish_s_runs": [round(x, 3) for x in pushes]}
               if pushes else {}),
            **{key: round(statistics.median(v), 3) for key, v in inside.items() if v}}, samples  # fmt: skip


def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _rank_memory_body(rank: int, world: int, port: int, strategy: str, lean: bool, vocab: int, out_dir: str) -> None:
    """One rank: build the large-vocabulary tiny Llama, wrap it, run one ``dp_ppo_update``; write its peak RSS."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.algorithm.settings import UpdateSettings
    from drmas_train.collect.samples import Sample
    from drmas_train.distributed.data_parallel import dp_ppo_update, wrap_model

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)  # fmt: skip
    model = wrap_model(LlamaForCausalLM(config), strategy, torch.device("cpu"))
    opt = build_optimizer("m", model, lr=1e-4)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(5, vocab, 32).tolist() for _ in range(2)]  # 2 groups of G = 4 rows
    samples = []
    for i in range(8):
        r = rng.integers(5, vocab, 128).tolist()
        samples.append(Sample(f"u{i % 2}", f"t{i}", "a", "m", 0, 0, prompts[i % 2], r, [-1.0] * len(r), [1] * len(r)))
    adv = rng.normal(size=len(samples))
    forward = {} if lean else {"lm_head_chunk": 0, "share_prompts": False}
    before = _rss_mb()
    settings = UpdateSettings.defaults(micro_batch_tokens=640, **forward)
    dp_ppo_update(model, opt, samples, adv, settings, rank=rank, world_size=world, pad_token_id=0)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"before_mb": before, "peak_mb": _rss_mb()}))
    dist.destroy_process_group()


def rank_memory(vocab: int) -> dict:
    """Peak RSS per rank (2 gloo ranks) of one update, plain vs lean forward, FSDP2 and DDP (see the docstring)."""
    import socket

    import torch.multiprocessing as mp

    out: dict = {"vocab": vocab, "samples": 8, "prompt_tokens": 32, "response_tokens": 128, "micro_batch_tokens": 640}
    for strategy in ("fsdp2", "ddp"):
        for name, lean in (("plain", False), ("lean", True)):
            with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                s.close()
                mp.spawn(_rank_memory_body, args=(2, port, strategy, lean, vocab, tmp), nprocs=2, join=True)
                ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
            out[f"{strategy}_{name}"] = {"peak_mb": [round(r["peak_mb"], 1) for r in ranks],
                                         "update_mb": [round(r["peak_mb"] - r["before_mb"], 1) for r in ranks]}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny-qwen3")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank-vocab", type=int, default=65536, help="vocabulary of the rank-memory model")
    p.add_argument("--setups", default=",".join(SETUPS), help="comma-separated setups to run (single always)")
    p.add_argument("--rank-memory-only", action="store_true", help="only the rank-memory measurement (no Ray)")
    p.add_argument("--no-rank-memory", action="store_true", help="skip the rank-memory measurement (Ray setups only; "
                   "run --rank-memory-only in its own process: after the Ray setups its spawned ranks were once seen "
                   "to hang, 2026-12-07)")  # fmt: skip
    args = p.parse_args(argv)
    chosen = [s for s in args.setups.split(",") if s]
    if not chosen or set(chosen) - set(SETUPS) or "single" not in chosen:
        p.error(f"--setups {args.setups!r}: a comma-separated subset of {','.join(SETUPS)} that includes single")
    if args.rank_memory_only:
        out = {"benchmark": "distributed", "cpu_count": os.cpu_count(), "rank_memory": rank_memory(args.rank_vocab),
               "load_avg_1m": round(os.getloadavg()[0], 2)}  # fmt: skip
        print(json.dumps(out, indent=2))
        return out

    import ray
    import torch

    from drmas_train.distributed.cluster import init_ray
    from drmas_train.run.trainer import build_run

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    init_ray(None, num_cpus=args.num_cpus)
    setups, samples = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for name in chosen:
            extra = SETUPS[name]
            t0 = time.perf_counter()
            run = build_run(_config(args, os.path.join(tmp, name), *extra))
            startup = time.perf_counter() - t0
            try:
                setups[name], samples = _measure(run, args, samples)
            finally:
                run.updater.close()
            setups[name]["startup_s"] = round(startup, 2)
    ray.shutdown()
    memory = None if args.no_rank_memory else rank_memory(args.rank_vocab)
    s, r1, r2 = setups["single"], setups.get("ray_1"), setups.get("ray_2")
    if keep := setups.get("ray_1_keep"):  # the rank holding its freed memory (distributed.rank_host_memory=keep)
        setups["ray_1_keep"]["vs_single"] = {
            "update": round(keep["update_s"] / s["update_s"], 3),
            **({"update_without_publish": round((keep["update_s"] - keep["publish_s"]) / s["update_s"], 3)}
               if "publish_s" in keep else {}),
            **({"inside_rank": round(keep["rank_update_s"] / s["update_s"], 3)} if "rank_update_s" in keep else {})}  # fmt: skip
    out = {
        "benchmark": "distributed", "model": args.model, "tasks": args.tasks, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "cpu_count": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2), "setups": setups, "rank_memory": memory,
    }  # fmt: skip
    if r1:
        out["ray_overhead"] = {"rollout": round((r1["rollout_s"] - s["rollout_s"]) / s["rollout_s"], 3),
                               "update": round((r1["update_s"] - s["update_s"]) / s["update_s"], 3)}  # fmt: skip
        if "publish_s" in r1:  # the one-rank update without its weight push, against the single process's
            out["ray_overhead"]["update_without_publish"] = round(
                (r1["update_s"] - r1["publish_s"] - s["update_s"]) / s["update_s"], 3)
        if "rank_update_s" in r1:  # the rank's own update (π_old + PPO steps) against the single process's
            out["ray_overhead"]["inside_rank"] = round((r1["rank_update_s"] - s["update_s"]) / s["update_s"], 3)
    if r1 and r2:
        out["speedup_2_vs_1"] = {"rollout": round(r1["rollout_s"] / r2["rollout_s"], 3),
                                 "update": round(r1["update_s"] / r2["update_s"], 3)}  # fmt: skip
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
