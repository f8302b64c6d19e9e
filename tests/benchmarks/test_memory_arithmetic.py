"""benchmarks/perf/memory_arithmetic.py: exact parameter counts and the per-GPU formulas of docs/scaling.md."""

from __future__ import annotations

from helpers.scripts import load_script

mem = load_script("benchmarks/perf/memory_arithmetic.py")


def test_qwen25_3b_parameter_count_by_hand():
    # embeddings 151936 x 2048 (tied) + 36 layers x (q 2048x2048+b, k/v 2048x256+b, o 2048x2048, MLP 3 x 2048x11008,
    # 2 norms) + final norm
    layer = (2048 * 2048 + 2048) + 2 * (2048 * 256 + 256) + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048
    assert mem.arch_numbers("Qwen2.5-3B")["params"] == 151936 * 2048 + 36 * layer + 2048 == 3_085_938_688


def test_published_sizes_and_kv_bytes():
    n = {name: mem.arch_numbers(name) for name in mem.ARCHS}
    assert round(n["Qwen2.5-7B"]["params"] / 1e9, 2) == 7.62  # model card: 7.61B (untied head counted)
    assert round(n["Qwen3-4B"]["params"] / 1e9, 1) == 4.0 and round(n["Qwen3-1.7B"]["params"] / 1e9, 1) == 1.7
    # 2 (K and V) x layers x kv heads x head dim x 2 bytes (bf16)
    assert n["Qwen3-4B"]["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2 == 147_456
    assert n["Qwen2.5-7B"]["kv_bytes_per_token"] == 2 * 28 * 4 * 128 * 2


def test_setup_row_formulas():
    s = mem.Setup("x", "p", ("Qwen3-4B",), 4, 256, 4096, 4096)
    row = mem.setup_memory(s, micro_batch_tokens=16384, gpu_gb=80.0)
    p = 4_022_468_096
    assert row["weights_grads_adam_gb"] == round(16 * p / 4 / 1e9, 1) == 16.1
    assert row["vllm_weights_gb"] == round(2 * p / 1e9, 1)
    # activations: 36 x 16384 x 2560 x 2 + 16384 x (4 x 2560 + 3 x 9728) x 2 + 8192 response tokens x 151936 x 14
    acts = 36 * 16384 * 2560 * 2 + 16384 * (4 * 2560 + 3 * 9728) * 2 + 8192 * 151936 * 14
    assert row["activations_gb"] == round(acts / 1e9, 1)
    three_7b = mem.Setup("y", "p", ("Qwen2.5-7B",) * 3, 4, 640, 4096, 800)
    r7 = mem.setup_memory(three_7b, 16384, 80.0)
    assert (r7["fits"], r7["fits_opt_offload"]) == (False, True)
