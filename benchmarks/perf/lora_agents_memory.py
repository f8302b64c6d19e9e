"""Memory of a two-agent team: LoRA adapters per agent on one base vs two full models (and vs LoRA per model).

Each arm trains the math team (``math-solver-verifier-v0``, the ``quickstart_math`` preset with a small model and
short replies) for a few iterations in a fresh process, and reports that process's peak resident memory
(``getrusage``), its wall time, and what its models hold: the bytes of distinct parameter storages (a base shared by
two adapters counts once), the trainable parameters and the AdamW state they need (two float32 moments each).

* ``full``: two separate models (``models.solver_model`` / ``models.verifier_model``, non-sharing), all weights
  trained: two bases, two gradients, two AdamW states;
* ``lora_per_model``: the same two models, each with one LoRA adapter (``models.<key>.lora``): two frozen bases;
* ``lora_per_agent``: one base with an adapter per agent (``models.base.adapters``, ``agents.<a>: base:<a>``).

    python benchmarks/perf/lora_agents_memory.py                       # tiny-qwen3, ~1-2 min on 2 cores
    python benchmarks/perf/lora_agents_memory.py --model tiny-llama --iterations 3

Prints one JSON object: per arm the numbers above, the ratios to ``full``, the load average before and after, and
the settings. Peak RSS includes the Python interpreter, torch and the env (a few hundred MB that every arm pays),
so the saving shows best in ``held_parameter_mb`` and in the peak difference, not in the peak ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# ``benchmarks`` is no package: the sibling arms.py (a fresh process per arm) is run by path
_arms = runpy.run_path(str(Path(__file__).with_name("arms.py")), run_name="drmas_bench_arms")
ArmFailed, run_arms = _arms["ArmFailed"], _arms["run_arms"]

ARMS = ("full", "lora_per_model", "lora_per_agent")
LORA = {"r": 16, "alpha": 32}


def arm_models(arm: str, model: str) -> dict[str, Any]:
    """The ``models`` and ``agents`` sections of one arm (the rest is ``quickstart_math``'s)."""
    lora = dict(LORA)
    if arm == "full":
        return {"models": {"solver_model": {"name_or_path": model}, "verifier_model": {"name_or_path": model}},
                "agents": {"solver": "solver_model", "verifier": "verifier_model"}}  # fmt: skip
    if arm == "lora_per_model":
        return {"models": {m: {"name_or_path": model, "lora": lora} for m in ("solver_model", "verifier_model")},
                "agents": {"solver": "solver_model", "verifier": "verifier_model"}}  # fmt: skip
    if arm == "lora_per_agent":
        return {"models": {"base": {"name_or_path": model, "adapters": {"solver": lora, "verifier": lora}}},
                "agents": {"solver": "base:solver", "verifier": "base:verifier"}}  # fmt: skip
    raise ValueError(f"unknown arm {arm!r}; accepted: {', '.join(ARMS)}")


def _held(pool: Any) -> dict[str, float]:
    """Bytes of distinct parameter storages, trainable parameter count and the AdamW state they need."""
    storages: dict[int, int] = {}
    trainable = 0
    seen: set[int] = set()
    for loaded in pool.models.values():
        for p in loaded.model.parameters():
            storages[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    from drmas_train.model.adapters import adapter_parameters

    for loaded in pool.models.values():
        params = (
            adapter_parameters(loaded)
            if loaded.spec.adapter
            else [p for p in loaded.model.parameters() if p.requires_grad]
        )
        for p in params:
            if id(p) not in seen:
                seen.add(id(p))
                trainable += p.numel()
    return {"held_parameter_mb": sum(storages.values()) / 2**20, "trainable_parameters": float(trainable),
            "adamw_state_mb": 2 * 4 * trainable / 2**20}  # fmt: skip


def child(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """Train one arm in this process; returns its numbers (peak RSS read right after training)."""
    import logging

    from drmas_train.backends.factory import build_models
    from drmas_train.run.config import load_config
    from drmas_train.run.models import model_specs
    from drmas_train.run.trainer import train

    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        yaml = (
            Path(tmp) / f"{arm}.yaml"
        )  # a child preset: its models and agents replace quickstart_math's whole
        yaml.write_text(json.dumps({"extends": "quickstart_math", **arm_models(arm, args.model)}))
        overrides = [
            f"run.dir={tmp}/run", f"run.iterations={args.iterations}", "run.num_threads=1", "run.progress=false",
            "run.tensorboard=false", "run.plot=false", "run.save_every=0", "run.save_samples=false", "eval.every=0",
            "rollout.batch_size=2", "rollout.group_size=2", f"rollout.max_new_tokens={args.max_new_tokens}",
            "rollout.max_prompt_tokens=512", f"seed={args.seed}",
        ]  # fmt: skip
        cfg = load_config(str(yaml), overrides)
        t0 = time.perf_counter()
        summary = train(cfg)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        held = _held(build_models(model_specs(cfg)))
    return {"peak_rss_mb": peak, "wall_s": wall, **held, "iterations": summary["iterations"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="peak memory: LoRA adapters per agent on one base vs two full models"
    )
    p.add_argument(
        "--model", default="tiny-qwen3", help="a named model or path (the same base for both agents)"
    )
    p.add_argument("--iterations", type=int, default=2, help="training iterations per arm")
    p.add_argument("--max-new-tokens", type=int, default=16, help="reply length limit per call, in tokens")
    p.add_argument("--seed", type=int, default=0, help="run seed")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated arms of {', '.join(ARMS)}")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        arm_models(arm, args.model)  # unknown arms fail before anything runs
    load_before = os.getloadavg()
    rerun = [sys.executable, str(Path(__file__).resolve())]
    settings = ["--model", args.model, "--iterations", str(args.iterations), "--max-new-tokens",
                str(args.max_new_tokens), "--seed", str(args.seed)]  # fmt: skip
    try:  # a fresh process per arm: its peak RSS is its own
        results = run_arms(arms, lambda arm: [*rerun, "--child", arm, *settings])
    except ArmFailed as err:
        print(err.stderr_tail, file=sys.stderr)
        return err.returncode
    if "full" in results:
        for r in results.values():
            r["peak_rss_vs_full"] = r["peak_rss_mb"] / results["full"]["peak_rss_mb"]
            r["peak_rss_saved_mb"] = results["full"]["peak_rss_mb"] - r["peak_rss_mb"]
            r["held_parameters_vs_full"] = r["held_parameter_mb"] / results["full"]["held_parameter_mb"]
    out = {"model": args.model, "iterations": args.iterations, "max_new_tokens": args.max_new_tokens,
           "lora": LORA, "arms": results, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
           "cpus": os.cpu_count()}  # fmt: skip
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
