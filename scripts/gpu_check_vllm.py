"""vLLM part of the GPU check (run by ``scripts/gpu_check.sh`` when ``import vllm`` works and the device is CUDA):
one :class:`~drmas_train.distributed.vllm_worker.VLLMGenerationWorker` step on the check's tiny random Qwen3, in this
process (no Ray). Prints one JSON object (the ``"vllm"`` field of the check's line); logs go to stderr.

Steps: start the engine (sleep mode on, asleep right after start-up) -> push new weights (``load_weights``: wake
the weights, load in place, wake the KV cache) -> greedy + seeded sampling -> ``sleep()`` (measures the GPU memory
it frees) -> a second push and generation (the wake-up path of a training iteration). The pushed weights are
another random init with the embeddings scaled up (peaked distributions), so the engine's log-probs match the HF
forward pass of the *pushed* weights and not the start-up ones only if the push took effect.

Fields: ``ok``, ``vllm_version``, ``sleep_mode`` (the worker's: vLLM's platform has it; required here),
``startup_s``, ``load_weights_s``, ``sleep_freed_mb`` (free GPU memory gained
by ``sleep()``, ``torch.cuda.mem_get_info``), ``wake_load_s``, ``generate_tokens_per_s``,
``logprob_max_abs_diff_vs_hf`` (engine log-probs vs a float32 HF forward of the pushed weights, nats),
``logprob_max_abs_diff_vs_startup_weights`` (the same against the start-up weights: must be much larger),
``seeded_reproducible`` (the same seed twice gives the same samples), ``greedy_len``; or ``error``.
Exit codes: 0 ok, 1 a step failed or a check is false, 3 no CUDA / no vLLM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check (the tiny model, as the main check's)


def pushed_state(loader: Any, spec: Any) -> tuple[Any, dict[str, Any]]:
    """A second random init (seed + 1) with the token embeddings (tied to the LM head) scaled x8: peaked next-token
    distributions, far from the start-up weights'. Returns ``(float32 HF model, its state dict)``."""
    import dataclasses

    import torch

    model = loader(dataclasses.replace(spec, seed=spec.seed + 1, dtype="float32"), "shared").model
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_logprob_diff(model: Any, gens: list[Any], pad: int) -> float:
    """Max |engine log-prob - HF float32 log-prob| over the generated tokens (greedy: temperature 1)."""
    import torch

    from drmas_train.model.logprobs import forward_logprobs

    device = next(model.parameters()).device
    with torch.no_grad():
        lp, mask, _ = forward_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                                       pad_token_id=pad, temperature=1.0)  # fmt: skip
    engine = torch.zeros_like(lp)
    for i, g in enumerate(gens):
        engine[i, : len(g.logprobs)] = torch.tensor(g.logprobs, device=device)
    return float(((lp - engine).abs() * mask).max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    args = p.parse_args(argv)
    out: dict[str, Any] = {"ok": False}
    code = 1
    try:
        import torch

        if not torch.cuda.is_available():
            out["error"] = "CUDA is not available"
            return _emit(out, 3)
        try:
            import vllm
        except ImportError as err:
            out["error"] = f"vllm does not import: {err}"
            return _emit(out, 3)
        out["vllm_version"] = vllm.__version__
        import gpu_check

        from drmas_train.backends.base import SamplingParams, render_chat
        from drmas_train.distributed.vllm_worker import VLLMGenerationWorker
        from drmas_train.model.models import ModelSpec

        gargs = argparse.Namespace(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads)
        loader = gpu_check.make_loader(gargs)
        spec = ModelSpec(gpu_check.MODEL_NAME, dtype="bfloat16", device="cpu")
        with contextlib.redirect_stdout(sys.stderr):
            t0 = time.perf_counter()
            worker = VLLMGenerationWorker(spec, "shared", loader=loader, use_gpu=True, engine_kwargs={
                "gpu_memory_utilization": args.gpu_memory_utilization, "max_model_len": 512, "enforce_eager": True,
                "seed": 0})  # fmt: skip
            out["startup_s"] = round(time.perf_counter() - t0, 2)
            out["sleep_mode"] = worker.status()["sleep_mode"]  # the platform's is_sleep_mode_available()
            startup = loader(spec, "shared").model.float().cuda().eval()
            pushed, state = pushed_state(loader, spec)
            pushed.cuda().eval()
            tok = worker.backend.tokenizer
            prompts = [render_chat(tok, [{"role": "user", "content": q}])
                       for q in ("solve verify search", "answer reason check", "count sum add")]  # fmt: skip
            t0 = time.perf_counter()
            worker.load_weights(state, 0)
            out["load_weights_s"] = round(time.perf_counter() - t0, 3)
            greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
            t0 = time.perf_counter()
            gens = worker.generate_ids(prompts, greedy, 0)
            dt = time.perf_counter() - t0
            out["generate_tokens_per_s"] = round(sum(len(g.response_ids) for g in gens) / dt, 1)
            out["greedy_len"] = [len(g.response_ids) for g in gens]
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            out["logprob_max_abs_diff_vs_hf"] = round(max_logprob_diff(pushed, gens, pad), 4)
            out["logprob_max_abs_diff_vs_startup_weights"] = round(max_logprob_diff(startup, gens, pad), 4)
            seeded = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, n=2, seed=7)
            a = [g.response_ids for g in worker.generate_ids(prompts, seeded, 0)]
            b = [g.response_ids for g in worker.generate_ids(prompts, seeded, 0)]
            out["seeded_reproducible"] = a == b
            free_before = torch.cuda.mem_get_info()[0]
            worker.sleep()
            out["sleep_freed_mb"] = round((torch.cuda.mem_get_info()[0] - free_before) / 2**20, 1)
            t0 = time.perf_counter()
            worker.load_weights(state, 1)  # the wake-up path of a training iteration
            out["wake_load_s"] = round(time.perf_counter() - t0, 3)
            again = worker.generate_ids(prompts, greedy, 1)
            out["greedy_same_after_sleep"] = [g.response_ids for g in again] == [g.response_ids for g in gens]
            worker.close()
        lengths_ok = all(len(g.logprobs) == len(g.response_ids) > 0 for g in gens)
        pushed_ok = out["logprob_max_abs_diff_vs_hf"] < out["logprob_max_abs_diff_vs_startup_weights"] / 2
        sleep_ok = out["sleep_mode"] and out["sleep_freed_mb"] > 0
        out["ok"] = bool(lengths_ok and pushed_ok and sleep_ok and out["seeded_reproducible"])
        code = 0 if out["ok"] else 1
    except Exception as err:  # reported in the JSON; the traceback goes to stderr
        traceback.print_exc()
        out["error"] = f"{type(err).__name__}: {err}"
    return _emit(out, code)


def _emit(out: dict[str, Any], code: int) -> int:
    print(json.dumps(out), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
