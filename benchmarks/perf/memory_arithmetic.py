"""Per-GPU memory of the paper's setups under FSDP2 + colocated vLLM: the arithmetic behind docs/scaling.md.

Parameter counts are exact: each architecture is built from its published config on the meta device (no
weights, no download). Everything else is a formula with the assumptions printed next to it::

    python benchmarks/perf/memory_arithmetic.py                # Markdown table (the one in docs/scaling.md)
    python benchmarks/perf/memory_arithmetic.py --json         # the same numbers as JSON
    python benchmarks/perf/memory_arithmetic.py --micro-batch-tokens 8192 --gpu-gb 141

Per GPU, for a model of P parameters trained by a group of N ranks with FSDP2 full sharding (fp32 master
weights, bf16 compute, fp32 gradients: the reference's ``fsdp_config`` with mixed precision):

* weights 4P/N, gradients 4P/N, AdamW m and v 8P/N bytes (optimizer offload moves the 8P/N to host memory,
  ``langfengQ/DrMAS examples/drmas_trainer/run_math.sh``: ``optimizer_offload=True``);
* activations of one micro-batch of T padded tokens with per-layer gradient checkpointing: the layer inputs
  L*T*h*2 bytes, one layer recomputed ~T*(4h + 3I)*2 bytes, and the response logits R*V*14 bytes (bf16 logits,
  their float32 copy, float32 log-softmax for the entropy, float32 gradient; ``drmas_train/model/logprobs.py`` keeps
  logits of the R response tokens only);
* vLLM (tensor parallel 1): the bf16 weights 2P on every GPU that serves the model, plus the KV cache,
  2*L*kv_heads*head_dim*2 bytes per token.

Colocated groups take turns: the training phase holds every group's sharded state and one group's activations
(vLLM asleep: weights offloaded, KV freed); the generation phase holds every group's sharded state (not offloaded)
plus every served model's bf16 weights and the KV cache in what is left.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from dataclasses import dataclass

GB = 1e9

#: published configs (Hugging Face ``config.json`` of each model): the fields that size the model.
ARCHS = {
    "Qwen3-4B": ("Qwen3", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                               num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "Qwen3-1.7B": ("Qwen3", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)),
    "Qwen2.5-3B": ("Qwen2", dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                                 num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)),
    "Qwen2.5-7B": ("Qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)),
}  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """One paper setting: the models (one worker group each), GPUs, and the rollout shape of the preset."""

    name: str
    preset: str
    models: tuple[str, ...]
    gpus: int
    episodes: int  # N x G episodes per iteration
    prompt_tokens: int
    response_tokens: int


_PAPER = (
    Setup("math, shared Qwen3-4B", "drmas_math_qwen3_4b_dist", ("Qwen3-4B",), 4, 32 * 8, 4096, 4096),
    Setup("math, non-sharing 2 x Qwen3-4B", "drmas_math_qwen3_4b_nonsharing_dist", ("Qwen3-4B",) * 2, 4, 256, 4096, 4096),
    Setup("math, hetero Qwen3-4B + 1.7B", "drmas_math_qwen3_4b_hetero_dist", ("Qwen3-4B", "Qwen3-1.7B"), 4, 256, 4096, 4096),
    Setup("search, shared Qwen2.5-3B", "drmas_search_qwen25_3b_dist", ("Qwen2.5-3B",), 8, 128 * 5, 4096, 800),
    Setup("search, non-sharing 3 x Qwen2.5-3B", "drmas_search_qwen25_3b_nonsharing_dist", ("Qwen2.5-3B",) * 3, 8, 640, 4096, 800),
    Setup("search, hetero 3B router + 7B", "drmas_search_qwen25_3b_hetero_dist", ("Qwen2.5-3B", "Qwen2.5-7B"), 8, 640, 4096, 800),
    Setup("search, non-sharing 3 x Qwen2.5-7B", "(reference run_search.sh)", ("Qwen2.5-7B",) * 3, 8, 640, 4096, 800),
)
#: every setup on its own GPU count, and the 8-GPU ones also on 4 GPUs (the question: what fits on 4 x 80 GB).
SETUPS = _PAPER + tuple(dataclasses.replace(s, gpus=4) for s in _PAPER if s.gpus == 8)  # fmt: skip


@functools.cache
def arch_numbers(name: str) -> dict[str, float]:
    """Exact parameter count (meta device) and the shape figures the formulas need."""
    import torch
    import transformers

    family, fields = ARCHS[name]
    config = getattr(transformers, f"{family}Config")(**fields)
    with torch.device("meta"):
        model = getattr(transformers, f"{family}ForCausalLM")(config)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    head_dim = fields.get("head_dim", fields["hidden_size"] // fields["num_attention_heads"])
    return {
        "params": params,
        "layers": fields["num_hidden_layers"],
        "hidden": fields["hidden_size"],
        "intermediate": fields["intermediate_size"],
        "vocab": fields["vocab_size"],
        "kv_bytes_per_token": 2 * fields["num_hidden_layers"] * fields["num_key_value_heads"] * head_dim * 2,
    }


def setup_memory(s: Setup, micro_batch_tokens: int, gpu_gb: float) -> dict[str, float | str | bool]:
    """GB per GPU of one setup (all groups colocated on all ``s.gpus`` GPUs)."""
    archs = [arch_numbers(m) for m in s.models]
    resp_share = s.response_tokens / (s.prompt_tokens + s.response_tokens)
    T, R = micro_batch_tokens, micro_batch_tokens * resp_share
    weights = sum(4 * a["params"] / s.gpus for a in archs) / GB
    grads = weights
    adam = 2 * weights
    acts = max(
        (a["layers"] * T * a["hidden"] * 2 + T * (4 * a["hidden"] + 3 * a["intermediate"]) * 2 + R * a["vocab"] * 14)
        for a in archs
    ) / GB
    vllm_weights = sum(2 * a["params"] for a in archs) / GB
    train_phase = weights + grads + adam + acts
    train_phase_offload = weights + grads + acts
    # generation: sharded training state stays (grads freed after the step), every served model's bf16 weights
    gen_fixed = weights + adam + vllm_weights
    gen_fixed_offload = weights + vllm_weights
    kv_per_token = max(a["kv_bytes_per_token"] for a in archs)
    per_gpu_seqs = s.episodes / s.gpus
    kv_worst = per_gpu_seqs * (s.prompt_tokens + s.response_tokens) * kv_per_token / GB
    return {
        "setup": s.name, "preset": s.preset, "gpus": s.gpus,
        "params_b": round(sum(a["params"] for a in archs) / 1e9, 2),
        "weights_grads_adam_gb": round(weights + grads + adam, 1),
        "adam_gb": round(adam, 1),
        "activations_gb": round(acts, 1),
        "train_phase_gb": round(train_phase, 1),
        "train_phase_opt_offload_gb": round(train_phase_offload, 1),
        "vllm_weights_gb": round(vllm_weights, 1),
        "gen_fixed_gb": round(gen_fixed, 1),
        "gen_fixed_opt_offload_gb": round(gen_fixed_offload, 1),
        "kv_kib_per_token": round(kv_per_token / 1024, 1),
        "kv_room_gb": round(gpu_gb - gen_fixed, 1),
        "kv_room_opt_offload_gb": round(gpu_gb - gen_fixed_offload, 1),
        "kv_worst_case_gb": round(kv_worst, 1),
        "fits": bool(train_phase <= gpu_gb and gen_fixed <= 0.9 * gpu_gb),
        "fits_opt_offload": bool(train_phase_offload <= gpu_gb and gen_fixed_offload <= 0.9 * gpu_gb),
    }  # fmt: skip


def markdown(rows: list[dict]) -> str:
    head = ("| setup | GPUs | params (B) | weights+grads+Adam / GPU | activations (1 micro-batch) | train phase "
            "(opt. offload) | vLLM bf16 weights / GPU | generation fixed (opt. offload) | KV KiB/token | KV room "
            "(opt. offload) | worst-case KV demand | fits 80 GB? (opt. offload) |")
    lines = [head, "|" + " --- |" * 12]
    for r in rows:
        yes = lambda b: "yes" if b else "**no**"  # noqa: E731
        lines.append(
            f"| {r['setup']} | {r['gpus']} | {r['params_b']} | {r['weights_grads_adam_gb']} | {r['activations_gb']} | "
            f"{r['train_phase_gb']} ({r['train_phase_opt_offload_gb']}) | {r['vllm_weights_gb']} | "
            f"{r['gen_fixed_gb']} ({r['gen_fixed_opt_offload_gb']}) | {r['kv_kib_per_token']} | "
            f"{r['kv_room_gb']} ({r['kv_room_opt_offload_gb']}) | {r['kv_worst_case_gb']} | "
            f"{yes(r['fits'])} ({yes(r['fits_opt_offload'])}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--micro-batch-tokens", type=int, default=16384, help="padded tokens per forward/backward")
    p.add_argument("--gpu-gb", type=float, default=80.0, help="memory of one GPU, GB (1e9 bytes)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = [setup_memory(s, args.micro_batch_tokens, args.gpu_gb) for s in SETUPS]
    if args.json:
        print(json.dumps({"micro_batch_tokens": args.micro_batch_tokens, "gpu_gb": args.gpu_gb, "rows": rows}))
    else:
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
