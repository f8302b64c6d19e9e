"""float32 vs bf16 on this machine, stage by stage, against its measured matmul peak; prints one JSON object.

For each precision (``float32``: no autocast; ``bf16``: ``torch.autocast`` over float32 weights, as drmas runs a
float32 model with ``optim.autocast`` / ``rollout.autocast`` = ``bf16``, and as it runs the paper presets' float32
master weights), in interleaved rounds (a noisy neighbour hits both), one process, ``--threads`` torch threads:

* ``matmul``: GFLOP/s of (m, k) @ (k, n) at the model's shapes (an MLP projection over 2048 tokens, the same over a
  64-row decode step, an LM-head chunk): the machine's peak, the ceiling of every stage below;
* ``update``: the PPO update's forward + backward (:func:`drmas_train.model.logprobs.forward_logprobs` as
  :func:`drmas_train.algorithm.update.ppo_update` calls it: shared prompts, chunked LM head) of a quickstart-sized
  micro-batch (``--rows`` rows, ``--prompts`` distinct prompts of ``--prompt-tokens``, ``--response-tokens`` each);
* ``old_logprobs``: the same forward without gradients (a separate π_old recompute);
* ``prefill`` / ``decode``: the HF engine (:class:`drmas_train.backends.hf.HFBackend`) on the validation batch's
  shape: ``--gen-rows`` rows of ``--gen-prompt-tokens``, ``--gen-repeat`` samples of each distinct prompt, the prompts
  sharing a ``--gen-shared-tokens`` prefix (the template): prefill = a call with 1 new token, decode = the rest of a
  ``--new-tokens`` call. Prefill FLOPs count every row's prompt, as ``transformers.generate`` computes them; the
  engine computes a shared prompt once (``engine_prefill_tokens_fed``, accumulated over the calls), so its
  ``of_peak`` can pass 1;
* ``transformers_generate``: ``model.generate`` (sampling, KV cache) on the same prompts, side by side;
* ``drift``: per-token |log p_engine - log p_trainer| (nats) of the engine's sampled tokens, for each (engine,
  trainer) precision pair: what the PPO ratio's first step sees.

Achieved GFLOP/s of a stage = its matmul FLOPs (2 x the linear weights each token passes, the attention scores and
values, the LM head where it is computed; x 3 with the backward) over its seconds; ``of_peak`` divides by the
matmul peak of the same precision (the largest of the ``matmul`` shapes).

    python benchmarks/perf/precision.py                           # SmolLM2-135M, 2 threads, 3 rounds (~5 min)
    python benchmarks/perf/precision.py --model tiny-llama --rounds 1 --gen-rows 4 --new-tokens 4   # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

PRECISIONS = ("float32", "bf16")


def _autocast(precision: str):
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def _best(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def matmul_peaks(hidden: int, inner: int, vocab_chunk: int) -> dict[str, dict[str, float]]:
    """GFLOP/s per shape and precision (bf16 operands for ``bf16``: the autocast kernels' inputs)."""
    import torch

    shapes = {"mlp_2048_tokens": (2048, hidden, inner), "mlp_64_rows": (64, hidden, inner),
              "lm_head_chunk": (512, hidden, vocab_chunk)}  # fmt: skip
    out: dict[str, dict[str, float]] = {}
    for name, (m, k, n) in shapes.items():
        a, b = torch.randn(m, k), torch.randn(k, n)
        row = {}
        for precision in PRECISIONS:
            x, y = (a, b) if precision == "float32" else (a.bfloat16(), b.bfloat16())
            row[precision] = round(2 * m * k * n / _best(lambda x=x, y=y: x @ y, 5) / 1e9, 1)
        out[name] = row
    return out


def _layout(cfg: Any) -> tuple[int, int, int, int, int]:
    inner = int(getattr(cfg, "intermediate_size", 4 * cfg.hidden_size))
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", heads) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return int(cfg.hidden_size), inner, heads * head_dim, kv * head_dim, int(cfg.num_hidden_layers)


def token_flops(cfg: Any, context: float, lm_head: bool) -> float:
    """Forward matmul FLOPs of one token at ``context`` tokens of attention: q/k/v/o, the gated MLP, attention
    scores and values, and the LM head when ``lm_head``."""
    d, inner, q, kv, layers = _layout(cfg)
    linear = d * q + 2 * d * kv + q * d + 3 * d * inner
    per_layer = 2 * linear + 4 * context * q
    return layers * per_layer + (2 * d * int(cfg.vocab_size) if lm_head else 0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=200)
    p.add_argument("--response-tokens", type=int, default=40)
    p.add_argument("--gen-rows", type=int, default=64)
    p.add_argument("--gen-prompt-tokens", type=int, default=300)
    p.add_argument("--new-tokens", type=int, default=40)
    p.add_argument("--gen-repeat", type=int, default=4, help="samples per distinct prompt (avg@k's k)")
    p.add_argument("--gen-shared-tokens", type=int, default=200, help="the prompts' common prefix (the template)")
    args = p.parse_args(argv)

    import numpy as np
    import torch

    from drmas_train.backends.base import SamplingParams
    from drmas_train.backends.hf import HFBackend
    from drmas_train.model.logprobs import forward_logprobs
    from drmas_train.model.models import load_model
    from drmas_train.model.precision import bf16_speedup, cpu_bf16_isa

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    cfg = model.config
    vocab = int(cfg.vocab_size)
    rng = np.random.default_rng(0)
    d, inner, *_ = _layout(cfg)
    peaks = matmul_peaks(d, inner, min(vocab, 8192))
    peak = {pr: max(row[pr] for row in peaks.values()) for pr in PRECISIONS}

    # the update's micro-batch: G rows per distinct prompt (shared prompts), random tokens of the vocabulary
    prompts = [rng.integers(100, vocab - 1, args.prompt_tokens).tolist() for _ in range(args.prompts)]
    rows_p = [prompts[i % args.prompts] for i in range(args.rows)]
    rows_r = [rng.integers(100, vocab - 1, args.response_tokens).tolist() for _ in range(args.rows)]
    pad = tok.pad_token_id

    def update(precision: str) -> None:
        model.train()
        with _autocast(precision):
            lp, mask, _ = forward_logprobs(model, rows_p, rows_r, pad_token_id=pad, share_prompts=True)
        (-(lp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)

    @torch.no_grad()
    def old_logprobs(precision: str) -> None:
        model.eval()
        with _autocast(precision):
            forward_logprobs(model, rows_p, rows_r, pad_token_id=pad, share_prompts=True)

    # the validation batch's shape: --gen-rows rows, --gen-repeat samples of each distinct prompt (avg@k's k), the
    # prompts sharing a few-shot prefix of --gen-shared-tokens (one template, other questions)
    shared = rng.integers(100, vocab - 1, args.gen_shared_tokens).tolist()
    distinct = [shared + rng.integers(100, vocab - 1, args.gen_prompt_tokens - args.gen_shared_tokens + i % 7).tolist()
                for i in range(args.gen_rows // args.gen_repeat)]  # fmt: skip
    gen_rows = [p for p in distinct for _ in range(args.gen_repeat)]
    engines = {pr: HFBackend(model, tok, autocast="off" if pr == "float32" else "bf16", seed=0) for pr in PRECISIONS}

    def generate(precision: str, new: int) -> list[Any]:
        return engines[precision].generate_ids(distinct, SamplingParams(n=args.gen_repeat, temperature=0.7,
                                                                        max_new_tokens=new, seed=0))  # fmt: skip

    width = max(map(len, gen_rows))
    ids = torch.full((len(gen_rows), width), pad, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, r in enumerate(gen_rows):
        ids[b, width - len(r):] = torch.as_tensor(r)
        attn[b, width - len(r):] = 1

    @torch.no_grad()
    def hf_generate(precision: str) -> None:
        model.eval()
        with _autocast(precision):
            model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=0.7, top_k=0,
                           max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, pad_token_id=pad)  # fmt: skip

    timings: dict[str, dict[str, list[float]]] = {s: {pr: [] for pr in PRECISIONS} for s in
                                                  ("update", "old_logprobs", "prefill", "generate", "transformers_generate")}  # fmt: skip
    generations: dict[str, list[Any]] = {}
    for _ in range(args.rounds):
        for precision in PRECISIONS:  # interleaved
            for stage, fn, extra in (("update", update, ()), ("old_logprobs", old_logprobs, ()), ("prefill", generate, (1,)),
                                     ("transformers_generate", hf_generate, ())):  # fmt: skip
                start = time.perf_counter()
                fn(precision, *extra)
                timings[stage][precision].append(time.perf_counter() - start)
            start = time.perf_counter()
            generations[precision] = generate(precision, args.new_tokens)
            timings["generate"][precision].append(time.perf_counter() - start)

    # FLOPs of each stage (forward; x 3 with the backward)
    ctx_update = args.prompt_tokens + args.response_tokens / 2
    update_tokens = args.prompts * args.prompt_tokens + args.rows * args.response_tokens
    fwd_update = (args.prompts * args.prompt_tokens * token_flops(cfg, args.prompt_tokens / 2, False)
                  + args.rows * args.response_tokens * token_flops(cfg, ctx_update, True))  # fmt: skip
    prefill_tokens = sum(map(len, gen_rows))  # the rows' prompt tokens (what transformers.generate computes)
    fwd_prefill = prefill_tokens * token_flops(cfg, args.gen_prompt_tokens / 2, False) + len(gen_rows) * 2 * d * vocab
    engine_prefill = {pr: engines[pr].counters["prefill_tokens"] for pr in PRECISIONS}  # what the engine fed
    decode_tokens = {pr: sum(len(g.response_ids) for g in generations[pr]) - len(gen_rows) for pr in PRECISIONS}
    fwd_decode_per_token = token_flops(cfg, args.gen_prompt_tokens + args.new_tokens / 2, True)

    def stage_row(seconds: float, flops: float, tokens: float, precision: str) -> dict[str, float]:
        return {"s": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1),
                "gflops": round(flops / seconds / 1e9, 1), "of_peak": round(flops / seconds / 1e9 / peak[precision], 3)}  # fmt: skip

    med = {s: {pr: statistics.median(v) for pr, v in by.items()} for s, by in timings.items()}
    stages: dict[str, Any] = {}
    for pr in PRECISIONS:
        decode_s = max(med["generate"][pr] - med["prefill"][pr], 1e-9)
        stages.setdefault("update", {})[pr] = stage_row(med["update"][pr], 3 * fwd_update, update_tokens, pr)
        stages.setdefault("old_logprobs", {})[pr] = stage_row(med["old_logprobs"][pr], fwd_update, update_tokens, pr)
        stages.setdefault("prefill", {})[pr] = stage_row(med["prefill"][pr], fwd_prefill, prefill_tokens, pr)
        stages.setdefault("decode", {})[pr] = stage_row(decode_s, decode_tokens[pr] * fwd_decode_per_token, decode_tokens[pr], pr)
        gen_tokens = len(gen_rows) * args.new_tokens
        stages.setdefault("generate", {})[pr] = {"s": round(med["generate"][pr], 3),
                                                 "tokens_per_s": round(sum(len(g.response_ids) for g in generations[pr]) / med["generate"][pr], 1)}  # fmt: skip
        stages.setdefault("transformers_generate", {})[pr] = {"s": round(med["transformers_generate"][pr], 3),
                                                              "tokens_per_s": round(gen_tokens / med["transformers_generate"][pr], 1)}  # fmt: skip
    # engine vs trainer log-probs of the engine's own tokens, per (engine, trainer) precision pair
    drift = {}
    model.eval()
    for engine_pr, gens in generations.items():
        for trainer_pr in PRECISIONS:
            with torch.no_grad(), _autocast(trainer_pr):
                lp, _, _ = forward_logprobs(model, [g.prompt_ids for g in gens], [g.response_ids for g in gens],
                                            pad_token_id=pad, temperature=0.7)  # fmt: skip
            diffs = np.concatenate([np.abs(np.asarray(g.logprobs) - lp[b, : len(g.response_ids)].float().numpy())
                                    for b, g in enumerate(gens)])  # fmt: skip
            drift[f"engine_{engine_pr}/trainer_{trainer_pr}"] = {"mean": round(float(diffs.mean()), 5),
                                                                "max": round(float(diffs.max()), 4)}  # fmt: skip
    result = {
        "benchmark": "benchmarks/perf/precision.py", "model": args.model, "threads": args.threads, "rounds": args.rounds,
        "cpu_bf16_isa": cpu_bf16_isa(), "bf16_speedup_probe": round(bf16_speedup(), 2),
        "load_1min": [round(os.getloadavg()[0], 2)], "matmul_gflops": peaks, "matmul_peak_gflops": peak,
        "stages": stages,
        "speedup_bf16": {s: round(med[s]["float32"] / med[s]["bf16"], 2) for s in med},
        "generate_vs_transformers": {pr: round(med["transformers_generate"][pr] / med["generate"][pr], 2) for pr in PRECISIONS},
        "drift_nats": drift,
        "engine_prefill_tokens_fed": engine_prefill, "rows_prompt_tokens": prefill_tokens,
        "shapes": {"update": {"rows": args.rows, "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
                              "response_tokens": args.response_tokens},
                   "generation": {"rows": args.gen_rows, "prompt_tokens": args.gen_prompt_tokens, "new_tokens": args.new_tokens}},
    }  # fmt: skip
    result["load_1min"].append(round(os.getloadavg()[0], 2))
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
