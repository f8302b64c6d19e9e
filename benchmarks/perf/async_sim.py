"""Sync vs async wall-clock per iteration of the Dr. MAS setups on GPUs: a calibrated discrete-event model.

Reproduces the table of docs/scaling.md ("Sync vs async: a throughput model")::

    python benchmarks/perf/async_sim.py                          # every paper setup, JSON
    python benchmarks/perf/async_sim.py --markdown               # the same as the doc's Markdown table
    python benchmarks/perf/async_sim.py --setup search_qwen25_3b --eta 1 2 4 --iterations 10
    python benchmarks/perf/async_sim.py --cpu-check              # predicted sync/async ratio of the CPU quickstart

**What is simulated.** One iteration = N prompt groups x G episodes; an episode is a fixed sequence of agent
calls (model, prompt tokens, response tokens), with a retrieval latency after each search call. Every GPU runs
one inference engine per model (tensor parallel 1, the reference's ``tensor_model_parallel_size=1``,
``examples/drmas_trainer/run_math.sh:69``) with continuous batching, modelled as a processor-sharing server:
all sequences decoding on a GPU advance one token per *round*, and a round costs, per model with sequences on
that GPU (roofline: weights and KV cache read once per step, or the matmul FLOPs, whichever is larger)::

    step_s(m, n, ctx) = max((2 P_m + ctx * kv_m) / (BW * bw_eff),  2 P_m * n / (FLOPS * decode_eff))

for n sequences of model m holding ctx tokens of context in all; so a GPU's decode throughput grows with its
batch until the FLOPs bound (batch-dependent, as vLLM's). Prefill is compute-bound,
``2 P * tokens / (FLOPS * prefill_eff)``, and runs before decode resumes (vLLM schedules waiting prefills first).
An update of model m over T tokens (prompt + response of its calls) on g GPUs takes
``10 P_m T / (g * FLOPS * train_mfu)`` (2P old log-prob forward + 6P forward/backward + 2P recompute under
gradient checkpointing, ``run_math.sh:65``; one PPO epoch, ``verl/trainer/config/ppo_trainer.yaml:66``) plus the
optimizer state's round trip to host memory (``optimizer_offload=True``, ``run_math.sh:67``: 2 x 8P/g bytes
over PCIe). A weight push of model m takes ``push_s_per_param * P_m``.

* **sync** (the reference, and drmas's lock-step engine): every agent call of a turn is one batched call over all
  live episodes, split into equal contiguous chunks over the GPUs (``agent_system/agent/agents/base.py:90``, a
  blocking ``generate_sequences``; the agents of a step run one after the other,
  ``agent_system/agent/orchestra/math/math_orchestra.py:82-121``, ``.../search/search_orchestra.py:116-187``;
  turns in ``agent_system/multi_turn_rollout/rollout_loop.py:444-491``): each call waits for its slowest
  sequence. Then the engines sleep (weights to host memory and back: ``switch_s``), the models update **one after
  another** on all GPUs (``verl/trainer/ppo/ray_trainer.py:1268-1271`` old log-probs and ``1387-1393`` updates,
  a loop over worker groups whose calls block: ``verl/single_controller/base/decorator.py:505``,
  ``blocking=True``), and each pushes its weights once. (The reference reloads the weights into its SGLang engine
  at every ``generate_sequences`` call and flushes the engine's cache, ``verl/workers/sharding_manager/
  fsdp_sglang.py:92-119,162``; the model charges one push per model per iteration, as drmas's vLLM path does.)
* **async**: an event simulation. Episodes stream (no turn barrier: a call starts as soon as the episode's previous
  call and retrieval end); the trainer of each model consumes the complete groups of one batch; updates run in
  turn on the training GPUs, each followed by its weight push, during which generation stalls. Generation may run
  at most ``eta`` versions ahead: the groups of batch k are admitted once every model has version >= k - eta (so
  a sample is at most eta versions stale when its update consumes it). Placements:

  - ``colocated``: all GPUs do both (the Dr. MAS shared pool); an update pauses generation on every GPU
    (``switch_s`` per pause) and, on resuming, each GPU re-prefills the context of its in-flight sequences (the
    KV cache is freed while the trainer holds the GPU). Async gains come only from streaming: the next batch's
    episodes fill the GPUs while the current batch's long tail finishes.
  - ``split``: ``gen_gpus`` generate and the rest train, concurrently (AReaL, verl ``fully_async_policy``);
    gains from overlap, at the cost of fewer GPUs for each side.

  With ``eta = 0`` and ``colocated``, async *is* sync minus the turn barriers: for one-call episodes the two
  give the same time (``tests/benchmarks/test_async_sim.py``).

Defaults: published numbers where they exist (each cited next to it), assumptions otherwise (marked
``assumption``, with why it is plausible). Every result is a model prediction, not a measurement.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ModelSpec:
    """An LLM's size figures: parameters and KV-cache bytes per token (bf16), from its published config.json."""

    name: str
    params: float
    kv_bytes_per_token: float


#: 2 (K, V) x layers x kv heads x head_dim x 2 bytes. Parameter counts: docs/scaling.md section 5 (exact, built from
#: config.json by benchmarks/perf/memory_arithmetic.py) for Qwen3-4B, Qwen2.5-3B/7B; the model cards for Qwen3-8B
#: (8.2B) and Llama-3.2-3B (3.21B).
MODELS = {
    "Qwen3-4B": ModelSpec("Qwen3-4B", 4.02e9, 2 * 36 * 8 * 128 * 2),
    "Qwen3-8B": ModelSpec("Qwen3-8B", 8.19e9, 2 * 36 * 8 * 128 * 2),
    "Qwen2.5-3B": ModelSpec("Qwen2.5-3B", 3.09e9, 2 * 36 * 2 * 128 * 2),
    "Qwen2.5-7B": ModelSpec("Qwen2.5-7B", 7.62e9, 2 * 28 * 4 * 128 * 2),
    "Llama-3.2-3B": ModelSpec("Llama-3.2-3B", 3.21e9, 2 * 28 * 8 * 128 * 2),
}


@dataclass(frozen=True)
class Hardware:
    """A GPU's speeds. ``*_eff`` are the shares of the peak reached in practice (assumptions, see ``H100``)."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops: float
    bw_eff: float = 0.6  # assumption: decode reaches 50-70 % of HBM bandwidth; see roofline_check
    decode_eff: float = 0.5  # assumption: large-batch decode GEMMs
    prefill_eff: float = 0.5  # assumption: prefill is a large GEMM (50 % MFU is typical of vLLM prefill)
    train_mfu: float = 0.35  # assumption: FSDP bf16 training of 3-8B models reaches 30-45 % MFU on H100
    pcie_bytes_per_s: float = 25e9  # assumption: ~40 % of PCIe Gen5 x16's 64 GB/s for pinned-memory offload
    #: verl recipe/fully_async_policy/README.md, "checkpoint-engine Ablation": 0.12 s per NCCL push of
    #: Qwen2.5-Math-7B (4 trainer : 4 rollout ranks, H20); scaled by the parameter count.
    push_s_per_param: float = 0.12 / 7.6e9


#: NVIDIA H100 SXM datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense BF16. The paper's runs: 4 or 8 x H100
#: (langfengQ/DrMAS README.md:175-192, "Compute Requirements").
H100 = Hardware("H100-SXM", 3.35e12, 989e12)
#: NVIDIA H200 datasheet: 4.8 TB/s HBM3e, the same 989 TFLOPS dense BF16.
H200 = Hardware("H200", 4.8e12, 989e12)


@dataclass(frozen=True)
class Call:
    """One agent call: the model answering, its prompt and response tokens, the lock-step slot (the call's place
    in the orchestra's fixed order of batched calls) and the seconds after it before the next call (retrieval)."""

    model: str
    prompt: int
    response: int
    slot: int
    gap_s: float = 0.0


Episode = tuple[Call, ...]


# ------------------------------------------------------------------------------------------------------ costs


class GPUCosts:
    """Roofline costs of one GPU (see the module docstring for the formulas)."""

    def __init__(self, hw: Hardware, models: dict[str, ModelSpec]) -> None:
        self.hw, self.models = hw, models

    def step_s(self, model: str, n: int, ctx_tokens: float) -> float:
        """Seconds of one decode step of ``n`` sequences of ``model`` holding ``ctx_tokens`` of KV in all."""
        m, hw = self.models[model], self.hw
        memory = (2 * m.params + ctx_tokens * m.kv_bytes_per_token) / (hw.hbm_bytes_per_s * hw.bw_eff)
        compute = 2 * m.params * n / (hw.bf16_flops * hw.decode_eff)
        return max(memory, compute)

    def prefill_s(self, model: str, tokens: float) -> float:
        return 2 * self.models[model].params * tokens / (self.hw.bf16_flops * self.hw.prefill_eff)

    def update_s(self, model: str, tokens: float, gpus: int) -> float:
        p = self.models[model].params
        offload = 2 * 8 * p / gpus / self.hw.pcie_bytes_per_s
        return 10 * p * tokens / (gpus * self.hw.bf16_flops * self.hw.train_mfu) + offload

    def push_s(self, model: str) -> float:
        return self.hw.push_s_per_param * self.models[model].params

    def switch_s(self, models: Sequence[str]) -> float:
        """Sleep + wake of every engine on a GPU: its bf16 weights to host memory and back (vLLM sleep level 1)."""
        return 2 * sum(2 * self.models[m].params for m in set(models)) / self.hw.pcie_bytes_per_s


@dataclass(frozen=True)
class MeasuredCosts:
    """Costs from measured rates (the calibration hook): a compute-bound engine (throughput independent of the
    batch, as on a CPU: docs/scaling.md section 6, e_gen ~ 1), tokens/s per worker."""

    decode_tok_s: float
    prefill_tok_s: float
    update_tok_s: float
    push_time_s: float = 0.0
    switch_time_s: float = 0.0

    def step_s(self, model: str, n: int, ctx_tokens: float) -> float:
        return n / self.decode_tok_s

    def prefill_s(self, model: str, tokens: float) -> float:
        return tokens / self.prefill_tok_s

    def update_s(self, model: str, tokens: float, gpus: int) -> float:
        return tokens / (self.update_tok_s * gpus)

    def push_s(self, model: str) -> float:
        return self.push_time_s

    def switch_s(self, models: Sequence[str]) -> float:
        return self.switch_time_s


def roofline_check(hw: Hardware = H100) -> dict[str, float]:
    """The decode model against a published figure: Llama-3.1-8B (8.03B parameters, 128 KiB KV per token) on one
    H100 with vLLM reaches ~12,500 output tokens/s (morphllm.com/vllm-benchmarks, "Llama 3.1 8B (BF16) 1x H100
    80GB ~12,500 tok/s"); the model's decode-only rate at 256 sequences of ~400 tokens of context."""
    costs = GPUCosts(hw, {"llama8b": ModelSpec("Llama-3.1-8B", 8.03e9, 2 * 32 * 8 * 128 * 2)})
    n, ctx = 256, 400
    return {"model_tok_s": round(n / costs.step_s("llama8b", n, n * ctx)), "published_tok_s": 12500}


# ------------------------------------------------------------------------------------------ episode structures


@dataclass(frozen=True)
class LogNormal:
    """Token count ~ lognormal(median, sigma), at least 1, truncated at ``cap`` (the max response length: the
    long tail piles up there, as truncated responses do)."""

    median: float
    sigma: float
    cap: int

    def sample(self, rng: np.random.Generator) -> int:
        return int(min(self.cap, max(1, round(rng.lognormal(math.log(self.median), self.sigma)))))


@dataclass(frozen=True)
class MathEpisodes:
    """Solver <-> Verifier (``math_orchestra.py:82-121``, ``max_loop_num=2``, ``run_math.sh:33``): Solver, Verifier,
    and a second Solver call when the Verifier rejects. Max response 4096, prompts up to 8192
    (``run_math.sh:49-50``); thinking off (``run_math.sh:52``). Lengths and the rejection rate are assumptions:
    non-thinking Qwen3 solutions of competition math run to hundreds of tokens with a long tail to the cap."""

    solver: str
    verifier: str
    solver_len: LogNormal = LogNormal(800, 0.8, 4096)
    verifier_len: LogNormal = LogNormal(400, 0.8, 4096)
    question: LogNormal = LogNormal(120, 0.5, 1024)
    template: int = 250
    p_reject: float = 0.4

    def sample(self, rng: np.random.Generator) -> Episode:
        q = self.question.sample(rng) + self.template
        s0 = self.solver_len.sample(rng)
        v0 = self.verifier_len.sample(rng)
        calls = [Call(self.solver, q, s0, 0), Call(self.verifier, q + s0, v0, 1)]
        if rng.random() < self.p_reject:
            calls.append(Call(self.solver, min(8192, q + s0 + v0), self.solver_len.sample(rng), 2))
        return tuple(calls)


@dataclass(frozen=True)
class SearchEpisodes:
    """Verifier (router) -> Search | Answer, at most 4 steps (``search_orchestra.py:116-187``, ``run_search.sh:33``;
    no Search call at the last step), responses up to 800 tokens, prompts up to 4096 (``run_search.sh:49-50``),
    top-3 passages per search. Lengths, routing probabilities and the retrieval latency are assumptions: short
    router/query/answer replies, ~130 tokens per retrieved passage, an e5 + FAISS GPU server answering a query in
    about a tenth of a second."""

    verifier: str
    search: str
    answer: str
    verifier_len: LogNormal = LogNormal(120, 0.8, 800)
    search_len: LogNormal = LogNormal(60, 0.8, 800)
    answer_len: LogNormal = LogNormal(80, 0.8, 800)
    base_prompt: int = 400
    passage_tokens: int = 3 * 130
    p_sufficient_first: float = 0.25
    p_sufficient_later: float = 0.6
    retrieval_s: float = 0.1
    max_steps: int = 4

    def sample(self, rng: np.random.Generator) -> Episode:
        calls: list[Call] = []
        history = 0
        for step in range(self.max_steps):
            prompt = min(4096, self.base_prompt + history)
            v = self.verifier_len.sample(rng)
            calls.append(Call(self.verifier, prompt, v, 3 * step))
            p_yes = self.p_sufficient_first if step == 0 else self.p_sufficient_later
            if rng.random() < p_yes:
                calls.append(
                    Call(self.answer, min(4096, prompt + v), self.answer_len.sample(rng), 3 * step + 2)
                )
                break
            if step == self.max_steps - 1:
                break
            s = self.search_len.sample(rng)
            calls.append(Call(self.search, min(4096, prompt + v), s, 3 * step + 1, gap_s=self.retrieval_s))
            history += v + s + self.passage_tokens
        return tuple(calls)


@dataclass(frozen=True)
class Setup:
    """One paper setting: its models, GPUs, batch (N prompt groups x G episodes) and episode structure."""

    name: str
    models: tuple[str, ...]
    gpus: int
    groups: int
    group_size: int
    episodes: MathEpisodes | SearchEpisodes
    hardware: Hardware = H100
    source: str = ""

    def costs(self) -> GPUCosts:
        return GPUCosts(self.hardware, {m: MODELS[m] for m in self.models})

    def batches(self, iterations: int, seed: int) -> list[list[Episode]]:
        """``iterations`` batches of groups x group_size episodes, group members contiguous."""
        rng = np.random.default_rng(seed)
        n = self.groups * self.group_size
        return [[self.episodes.sample(rng) for _ in range(n)] for _ in range(iterations)]


def scale_lengths(episodes: MathEpisodes | SearchEpisodes, factor: float) -> MathEpisodes | SearchEpisodes:
    """The same episode structure with every median response length multiplied by ``factor`` (caps kept)."""
    changes = {f.name: dataclasses.replace(v, median=v.median * factor)
               for f in dataclasses.fields(episodes)
               if f.name.endswith("_len") and isinstance(v := getattr(episodes, f.name), LogNormal)}  # fmt: skip
    return dataclasses.replace(episodes, **changes)


_MATH = "run_math.sh:9,24 (32 prompts x 8), README.md:187-192 (GPUs)"
_SEARCH = "run_search.sh:9,24 (128 prompts x 5), README.md:178-184 (GPUs)"
SETUPS = {
    s.name: s
    for s in (
        Setup("math_qwen3_4b", ("Qwen3-4B",), 4, 32, 8, MathEpisodes("Qwen3-4B", "Qwen3-4B"), source=_MATH),
        Setup("math_qwen3_4b_nonsharing", ("Qwen3-4B/solver", "Qwen3-4B/verifier"), 4, 32, 8,
              MathEpisodes("Qwen3-4B/solver", "Qwen3-4B/verifier"), source=_MATH),
        Setup("math_qwen3_8b", ("Qwen3-8B",), 8, 32, 8, MathEpisodes("Qwen3-8B", "Qwen3-8B"), source=_MATH),
        Setup("search_qwen25_3b", ("Qwen2.5-3B",), 4, 128, 5,
              SearchEpisodes("Qwen2.5-3B", "Qwen2.5-3B", "Qwen2.5-3B"), source=_SEARCH),
        Setup("search_qwen25_3b_nonsharing", ("Qwen2.5-3B/verifier", "Qwen2.5-3B/search", "Qwen2.5-3B/answer"), 4,
              128, 5, SearchEpisodes("Qwen2.5-3B/verifier", "Qwen2.5-3B/search", "Qwen2.5-3B/answer"), source=_SEARCH),
        Setup("search_qwen25_7b", ("Qwen2.5-7B",), 8, 128, 5,
              SearchEpisodes("Qwen2.5-7B", "Qwen2.5-7B", "Qwen2.5-7B"), source=_SEARCH),
        Setup("search_hetero_llama3b_qwen7b", ("Llama-3.2-3B", "Qwen2.5-7B"), 8, 128, 5,
              SearchEpisodes("Llama-3.2-3B", "Llama-3.2-3B", "Qwen2.5-7B"),
              source=_SEARCH + "; agents as drmas_search_qwen25_3b_hetero: Llama router + search, Qwen answer"),
    )
}  # fmt: skip
# "Qwen3-4B/solver": a second copy of the architecture (non-sharing): a model key is "<architecture>[/<copy>]".
for _key in [k for s in SETUPS.values() for k in s.models if "/" in k]:
    MODELS.setdefault(_key, dataclasses.replace(MODELS[_key.split("/")[0]], name=_key))


# --------------------------------------------------------------------------------------------- sync (lock-step)


def batched_call_s(calls: Sequence[Call], costs: Any) -> tuple[float, float, float, float]:
    """One batched call of one model on one engine: all sequences start together, prefill first, then decode until
    the last sequence ends. Returns (seconds, seconds until 90 % of the sequences have ended, decode seconds,
    sequence-seconds of decode: their ratio is the mean decode batch). Decode is processor sharing: between two
    completions every live sequence gains the same number of tokens, each step costing ``step_s`` of the live
    set; a sequence's context is taken as prompt + half its response (its mean over the decode)."""
    if not calls:
        return 0.0, 0.0, 0.0, 0.0
    model = calls[0].model
    t = prefill = costs.prefill_s(model, sum(c.prompt for c in calls))
    order = sorted(calls, key=lambda c: c.response)
    ctx = sum(c.prompt + c.response / 2 for c in order)
    done_tokens, t90, n, seq_s = 0, None, len(order), 0.0
    for i, c in enumerate(order):
        dt = (c.response - done_tokens) * costs.step_s(model, n - i, ctx)
        t += dt
        seq_s += dt * (n - i)
        done_tokens = c.response
        ctx -= c.prompt + c.response / 2
        if t90 is None and i + 1 >= math.ceil(0.9 * n):
            t90 = t
    return t, float(t90), t - prefill, seq_s


def _chunks(n: int, parts: int) -> list[range]:
    """Contiguous chunks of ``range(n)`` over ``parts`` workers, as verl's DP dispatch splits a batch."""
    return [range(n * i // parts, n * (i + 1) // parts) for i in range(parts)]


def sync_iteration(
    batch: Sequence[Episode], models: Sequence[str], gpus: int, costs: Any
) -> dict[str, float]:
    """One lock-step iteration: per slot, one batched call per model over the live episodes (each GPU its chunk;
    the slot ends with the slowest GPU), then the slot's retrieval (the longest gap); then ``switch_s``, the models'
    updates one after another on all GPUs, and one push per model."""
    chunks = _chunks(len(batch), gpus)
    slots = sorted({c.slot for ep in batch for c in ep})
    rollout = tail = gen_gpu_s = decode_s = seq_s = 0.0
    for slot in slots:
        per_gpu = []
        for chunk in chunks:
            calls = [c for i in chunk for c in batch[i] if c.slot == slot]
            by_model: dict[str, list[Call]] = {}
            for c in calls:
                by_model.setdefault(c.model, []).append(c)
            times = [batched_call_s(cs, costs) for cs in by_model.values()]
            per_gpu.append((sum(x[0] for x in times), sum(x[1] for x in times)))
            decode_s += sum(x[2] for x in times)
            seq_s += sum(x[3] for x in times)
        makespan = max(t for t, _ in per_gpu)
        rollout += makespan + max((c.gap_s for ep in batch for c in ep if c.slot == slot), default=0.0)
        tail += makespan - max(t9 for _, t9 in per_gpu)
        gen_gpu_s += sum(t for t, _ in per_gpu)
    tokens = {m: 0.0 for m in models}
    for ep in batch:
        for c in ep:
            tokens[c.model] += c.prompt + c.response
    update = sum(costs.update_s(m, tokens[m], gpus) for m in models)
    push = sum(costs.push_s(m) for m in models) + costs.switch_s(models)
    return {"rollout_s": rollout, "tail_s": tail, "update_s": update, "push_s": push,
            "iteration_s": rollout + update + push, "gen_gpu_s": gen_gpu_s, "train_gpu_s": update * gpus,
            "decode_gpu_s": decode_s, "seq_s": seq_s}  # fmt: skip


def simulate_sync(batches: Sequence[Sequence[Episode]], models: Sequence[str], gpus: int, costs: Any,
                  warmup: int = 2) -> dict[str, float]:  # fmt: skip
    """Lock-step sync over ``batches``: seconds per iteration over iterations ``warmup+1 .. K`` (the same window
    as ``simulate_async``), the mean of each term over the same window, and over all K iterations the GPU
    shares (generation, training) and the mean decode batch."""
    its = [sync_iteration(b, models, gpus, costs) for b in batches]
    ends = np.cumsum([it["iteration_s"] for it in its])
    w = min(warmup, len(its) - 1)
    per_iter = (ends[-1] - (ends[w - 1] if w > 0 else 0.0)) / (len(its) - w)
    mean = {
        k: float(np.mean([it[k] for it in its[w:]])) for k in ("rollout_s", "tail_s", "update_s", "push_s")
    }
    total = float(ends[-1]) * gpus
    return {"s_per_iter": float(per_iter), **mean,
            "gen_util": sum(it["gen_gpu_s"] for it in its) / total,
            "train_util": sum(it["train_gpu_s"] for it in its) / total,
            "mean_batch": sum(it["seq_s"] for it in its) / max(1e-12, sum(it["decode_gpu_s"] for it in its))}  # fmt: skip


# ---------------------------------------------------------------------------------------- async (event-driven)


@dataclass
class _Seq:
    ep: int
    call: Call
    finish_v: float = 0.0


@dataclass
class _GPU:
    """A processor-sharing engine: virtual clock ``v`` = tokens every live sequence has gained."""

    v: float = 0.0
    t_last: float = 0.0
    paused: bool = False
    token: int = 0
    heap: list = field(default_factory=list)  # (finish_v, seq id)
    live: dict = field(default_factory=dict)  # seq id -> _Seq
    n: dict = field(default_factory=dict)  # model -> live sequences
    ctx: dict = field(default_factory=dict)  # model -> context tokens of its live sequences
    prefill: deque = field(default_factory=deque)  # [remaining s, seq id or None]
    busy_s: float = 0.0
    decode_s: float = 0.0
    seq_s: float = 0.0  # sequence-seconds of decode (/ decode_s = mean decode batch)


class AsyncSim:
    """Event-driven async training (see the module docstring). Deterministic for given batches."""

    def __init__(self, batches: Sequence[Sequence[Episode]], models: Sequence[str], gpus: int, costs: Any, *,
                 eta: int, placement: str = "colocated", gen_gpus: int | None = None,
                 measure: int | None = None) -> None:  # fmt: skip
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        if placement not in ("colocated", "split"):
            raise ValueError(f"placement must be 'colocated' or 'split', got {placement!r}")
        if placement == "split" and not (gen_gpus and 0 < gen_gpus < gpus):
            raise ValueError(f"split placement needs 0 < gen_gpus < gpus ({gpus}), got {gen_gpus}")
        self.batches, self.models, self.costs, self.eta = batches, list(models), costs, eta
        self.colocated = placement == "colocated"
        self.n_gen = gpus if self.colocated else int(gen_gpus)  # type: ignore[arg-type]
        self.n_train = gpus if self.colocated else gpus - self.n_gen
        self.gpus = gpus
        self.g = [_GPU() for _ in range(self.n_gen)]
        self.events: list = []
        self.seq_id = 0
        self.t = 0.0
        self.version = {m: 0 for m in models}
        self.admitted = 0  # batches admitted
        self.batch_left = [len(b) for b in batches]
        self.ep_state: dict[tuple[int, int], int] = {}  # (batch, episode) -> next call index
        self.jobs: deque = deque()
        self.trainer_busy = False
        self.version_done: list[float] = []  # time every model reached version k (k = 1..)
        self.train_gpu_s = 0.0
        self.pause_start: float | None = None
        self.admitted_at_version: list[int] = []  # batch -> min model version when its groups were admitted
        self.max_staleness = 0  # the largest (trainer version - admission version) of an update's batch
        self.consumed: dict[str, int] = {m: 0 for m in models}  # batches each model's trainer has consumed
        self.complete: set[int] = set()
        self.measure = len(batches) if measure is None else measure
        self.snapshot: dict[str, float] = {}
        self.next_queue = 0

    # -- engines
    def _round_s(self, g: _GPU) -> float:
        return sum(self.costs.step_s(m, n, g.ctx[m]) for m, n in g.n.items() if n > 0)

    def _advance(self, g: _GPU) -> None:
        dt = self.t - g.t_last
        g.t_last = self.t
        if dt <= 0 or g.paused:
            return
        if g.prefill:
            g.prefill[0][0] -= dt
            g.busy_s += dt
        elif g.live:
            g.v += dt / self._round_s(g)
            g.busy_s += dt
            g.decode_s += dt
            g.seq_s += dt * len(g.heap)

    def _schedule(self, gi: int) -> None:
        g = self.g[gi]
        g.token += 1
        if g.paused:
            return
        if g.prefill:
            heapq.heappush(self.events, (self.t + max(0.0, g.prefill[0][0]), 0, "gpu", gi, g.token))
        elif g.heap:
            dt = max(0.0, g.heap[0][0] - g.v) * self._round_s(g)
            heapq.heappush(self.events, (self.t + dt, 0, "gpu", gi, g.token))

    def _gpu_event(self, gi: int) -> None:
        g = self.g[gi]
        self._advance(g)
        if g.prefill:
            _, sid = g.prefill.popleft()
            if sid is not None:
                s = g.live[sid]
                s.finish_v = g.v + s.call.response
                heapq.heappush(g.heap, (s.finish_v, sid))
                m = s.call.model
                g.n[m] = g.n.get(m, 0) + 1
                g.ctx[m] = g.ctx.get(m, 0.0) + s.call.prompt + s.call.response / 2
        else:
            eps = 1e-9 * max(1.0, g.v)
            finished = []
            while g.heap and g.heap[0][0] <= g.v + eps:
                _, sid = heapq.heappop(g.heap)
                s = g.live.pop(sid)
                m = s.call.model
                g.n[m] -= 1
                g.ctx[m] -= s.call.prompt + s.call.response / 2
                finished.append(s)
            for s in finished:
                self._call_done(s)
        self._schedule(gi)

    # -- episodes
    def _gpu_of(self, b: int, e: int) -> int:
        """The engine of episode e: the same contiguous chunks as the lock-step split (``_chunks``)."""
        n = len(self.batches[b])
        return next(i for i, chunk in enumerate(_chunks(n, self.n_gen)) if e in chunk)

    def _issue(self, b: int, e: int) -> None:
        call = self.batches[b][e][self.ep_state[(b, e)]]
        gi = self._gpu_of(b, e)
        g = self.g[gi]
        self._advance(g)
        self.seq_id += 1
        g.live[self.seq_id] = _Seq(e + b * 10**6, call)
        g.prefill.append([self.costs.prefill_s(call.model, call.prompt), self.seq_id])
        self._schedule(gi)

    def _call_done(self, s: _Seq) -> None:
        b, e = divmod(s.ep, 10**6)
        self.ep_state[(b, e)] += 1
        if self.ep_state[(b, e)] == len(self.batches[b][e]):
            self.batch_left[b] -= 1
            if self.batch_left[b] == 0:
                self._batch_complete(b)
        elif s.call.gap_s > 0:
            heapq.heappush(self.events, (self.t + s.call.gap_s, 1, "next", b, e))
        else:
            self._issue(b, e)

    def _admit(self) -> None:
        while self.admitted < len(self.batches) and self.admitted <= min(self.version.values()) + self.eta:
            b = self.admitted
            self.admitted += 1
            self.admitted_at_version.append(min(self.version.values()))
            for e in range(len(self.batches[b])):
                self.ep_state[(b, e)] = 0
                self._issue(b, e)

    # -- trainer
    def _batch_complete(self, b: int) -> None:
        """Queue the updates of the complete batches in batch order (a later batch may finish first: it waits)."""
        self.complete.add(b)
        while self.next_queue in self.complete:
            k = self.next_queue
            self.next_queue += 1
            tokens = {m: 0.0 for m in self.models}
            for ep in self.batches[k]:
                for c in ep:
                    tokens[c.model] += c.prompt + c.response
            for m in self.models:
                self.jobs.append((m, tokens[m], k))
        self._start_job()

    def _set_paused(self, paused: bool) -> None:
        for gi, g in enumerate(self.g):
            self._advance(g)
            g.paused = paused
            # colocated: the KV cache was freed while the trainer held the GPU: re-prefill the live contexts
            if not paused and self.colocated and g.live:
                decoding = [s for s in g.live.values() if s.finish_v > 0 and s.finish_v > g.v]
                redo = sum(self.costs.prefill_s(s.call.model, s.call.prompt + s.call.response - (s.finish_v - g.v))
                           for s in decoding)  # fmt: skip
                if redo > 0:
                    g.prefill.appendleft([redo, None])
            self._schedule(gi)

    def _start_job(self) -> None:
        if self.trainer_busy or not self.jobs:
            return
        m, tokens, b = self.jobs.popleft()
        self.trainer_busy = True
        assert b == self.consumed[m], "a model's trainer consumes its batches in order"
        self.consumed[m] += 1
        self.max_staleness = max(self.max_staleness, self.version[m] - self.admitted_at_version[b])
        dur = self.costs.update_s(m, tokens, self.n_train)
        self.train_gpu_s += dur * self.n_train
        if self.colocated:
            if self.pause_start is None:
                self.pause_start = self.t
                self._set_paused(True)
                dur += self.costs.switch_s(self.models)
            dur += self.costs.push_s(m)
            heapq.heappush(self.events, (self.t + dur, 2, "job", m, 0))
        else:
            heapq.heappush(self.events, (self.t + dur, 2, "push", m, 0))

    def _job_done(self, m: str) -> None:
        self.trainer_busy = False
        self.version[m] += 1
        if all(v >= len(self.version_done) + 1 for v in self.version.values()):
            self.version_done.append(self.t)
            if len(self.version_done) == self.measure:
                for g in self.g:
                    self._advance(g)
                self.snapshot = {"busy_s": sum(g.busy_s for g in self.g), "train_gpu_s": self.train_gpu_s,
                                 "decode_s": sum(g.decode_s for g in self.g), "seq_s": sum(g.seq_s for g in self.g)}  # fmt: skip
        if self.colocated and not self.jobs:
            self.pause_start = None
            self._set_paused(False)
        self._start_job()
        self._admit()

    def run(self) -> dict[str, float]:
        self._admit()
        while self.events:
            self.t, _, kind, a, b = heapq.heappop(self.events)
            if kind == "gpu":
                if b == self.g[a].token:
                    self._gpu_event(a)
            elif kind == "next":
                self._issue(a, b)
            elif kind == "job":
                self._job_done(a)
            elif kind == "push":  # split: update done; the push stalls generation, then the version counts
                self._set_paused(True)
                heapq.heappush(self.events, (self.t + self.costs.push_s(a), 2, "pushed", a, 0))
            elif kind == "pushed":
                self._set_paused(False)
                self._job_done(a)
        if len(self.version_done) != len(self.batches):
            raise RuntimeError(
                f"simulation stalled after {len(self.version_done)} of {len(self.batches)} batches"
            )
        snap = self.snapshot
        total = self.version_done[self.measure - 1] * self.gpus
        return {
            "ends": self.version_done,
            "max_staleness": self.max_staleness,
            "mean_batch": snap["seq_s"] / max(1e-12, snap["decode_s"]),
            "gen_util": snap["busy_s"] / total,
            "train_util": snap["train_gpu_s"] / total,
        }


def simulate_async(batches: Sequence[Sequence[Episode]], models: Sequence[str], gpus: int, costs: Any, *, eta: int,
                   placement: str = "colocated", gen_gpus: int | None = None, warmup: int = 2,
                   measure: int | None = None) -> dict[str, float]:  # fmt: skip
    """Async over ``batches``: seconds per iteration = (T_K - T_w) / (K - w), T_k the time every model reached
    version k, w = ``warmup`` (the pipeline fills during the first iterations), K = ``measure`` (default: all
    batches). Batches after the K-th keep generation busy to the end of the window, as in a longer run (give
    ``eta`` extra batches: without them the last iterations have no next batch to share the engines with).
    GPU shares and the mean decode batch are over [0, T_K]."""
    k = len(batches) if measure is None else measure
    if not 1 <= k <= len(batches):
        raise ValueError(f"measure must be in 1..{len(batches)}, got {measure}")
    out = AsyncSim(
        batches, models, gpus, costs, eta=eta, placement=placement, gen_gpus=gen_gpus, measure=k
    ).run()
    ends = out["ends"][:k]
    w = min(warmup, len(ends) - 1)
    per_iter = (ends[-1] - (ends[w - 1] if w > 0 else 0.0)) / (len(ends) - w)
    return {"s_per_iter": float(per_iter), "gen_util": out["gen_util"], "train_util": out["train_util"],
            "max_staleness": out["max_staleness"], "mean_batch": out["mean_batch"]}  # fmt: skip


# ------------------------------------------------------------------------------------------------- the table


def compare(setup: Setup, etas: Sequence[int] = (1, 2), iterations: int = 8, seed: int = 0,
            split_fractions: Sequence[float] = (0.25, 0.5, 0.75)) -> dict[str, Any]:  # fmt: skip
    """Sync and async (colocated, and split with the best of ``split_fractions`` of the GPUs generating) for one
    setup, on the same sampled batches."""
    extra = max(etas, default=0)
    batches = setup.batches(iterations + extra, seed)  # the async runs generate ahead into the extra ones
    costs = setup.costs()
    sync = simulate_sync(batches[:iterations], setup.models, setup.gpus, costs)
    row: dict[str, Any] = {"setup": setup.name, "models": list(setup.models), "gpus": setup.gpus,
                           "hardware": setup.hardware.name, "episodes_per_iter": setup.groups * setup.group_size,
                           "sync": {k: round(v, 3) for k, v in sync.items()}, "async": {}, "source": setup.source}  # fmt: skip
    for eta in etas:
        col = simulate_async(batches, setup.models, setup.gpus, costs, eta=eta, measure=iterations)
        splits = []
        for f in split_fractions:
            n = min(setup.gpus - 1, max(1, round(f * setup.gpus)))
            r = simulate_async(
                batches,
                setup.models,
                setup.gpus,
                costs,
                eta=eta,
                placement="split",
                gen_gpus=n,
                measure=iterations,
            )
            splits.append((r["s_per_iter"], n, r))
        best = min(splits, key=lambda x: x[0])
        row["async"][f"eta={eta}"] = {
            "colocated": {k: round(v, 3) for k, v in col.items()} | {"speedup": round(sync["s_per_iter"] / col["s_per_iter"], 2)},
            "split": {k: round(v, 3) for k, v in best[2].items()} | {"gen_gpus": best[1], "speedup": round(sync["s_per_iter"] / best[0], 2)},
        }  # fmt: skip
    row["dominant_sync_term"] = max(("rollout_s", "update_s", "push_s"), key=lambda k: sync[k])
    row["tail_share_of_sync"] = round(sync["tail_s"] / sync["s_per_iter"], 3)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """The doc's table: seconds per iteration (speed-up over sync), the sync terms, GPU utilisation."""
    etas = list(rows[0]["async"])
    util_eta = next((e for e in etas if e != "eta=0"), etas[0])
    head = ["setup", "GPUs", "sync s/iter", "sync: rollout (of it tail) / update / push+switch"]
    head += [f"async colocated {e}" for e in etas]
    head += [f"async split {e} (gen GPUs)" for e in etas if e != "eta=0"]
    head += ["GPU share gen / train (mean decode batch): sync", f"colocated {util_eta}", f"split {util_eta}"]
    head = [h.replace("eta=", "η=") for h in head]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        s = r["sync"]
        cells = [r["setup"], str(r["gpus"]), f"{s['s_per_iter']:.0f}",
                 f"{s['rollout_s']:.0f} ({s['tail_s']:.0f}) / {s['update_s']:.0f} / {s['push_s']:.1f}"]  # fmt: skip
        for e in etas:
            c = r["async"][e]["colocated"]
            cells.append(f"{c['s_per_iter']:.0f} ({c['speedup']:.2f}x)")
        for e in etas:
            if e != "eta=0":
                p = r["async"][e]["split"]
                cells.append(f"{p['s_per_iter']:.0f} ({p['speedup']:.2f}x, {p['gen_gpus']})")
        c, p = r["async"][util_eta]["colocated"], r["async"][util_eta]["split"]
        cells += [f"{x['gen_util']:.2f} / {x['train_util']:.2f} ({x['mean_batch']:.0f})" for x in (s, c, p)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- calibration hook


def predict_ratio(decode_tok_s: float, update_tok_s: float, sync_s: float, batches: Sequence[Sequence[Episode]],
                  *, prefill_tok_s: float, workers: int = 1, eta: int = 1, placement: str = "colocated",
                  gen_workers: int | None = None) -> dict[str, float]:  # fmt: skip
    """Predicted sync and async seconds per iteration, and their ratio, for a measured case.

    ``decode_tok_s``, ``prefill_tok_s``, ``update_tok_s``: measured rates of one worker (a CPU thread, a GPU);
    ``sync_s``: seconds of one weight push; ``batches``: measured episodes (e.g. ``load_episodes`` of a run's
    samples; the async run also generates ``eta`` batches past them, taken from their start). The engine is
    compute-bound (throughput independent of the batch), as measured on CPU. A later measured async run compares
    its sync/async ratio to ``ratio`` here."""
    models = sorted({c.model for b in batches for ep in b for c in ep})
    costs = MeasuredCosts(decode_tok_s, prefill_tok_s, update_tok_s, push_time_s=sync_s)
    sync = simulate_sync(batches, models, workers, costs, warmup=1)
    ahead = list(batches) + [batches[i % len(batches)] for i in range(eta)]
    asy = simulate_async(ahead, models, workers, costs, eta=eta, placement=placement, gen_gpus=gen_workers,
                         warmup=1, measure=len(batches))  # fmt: skip
    return {"sync_s_per_iter": sync["s_per_iter"], "sync_rollout_s": sync["rollout_s"],
            "sync_update_s": sync["update_s"], "async_s_per_iter": asy["s_per_iter"],
            "ratio": sync["s_per_iter"] / asy["s_per_iter"]}  # fmt: skip


QUICKSTART_EPISODES = Path(__file__).with_name("data") / "quickstart_math_episodes.json"


def load_episodes(path: Path = QUICKSTART_EPISODES) -> list[list[Episode]]:
    """Episodes per iteration from the compact file of measured call lengths (``[turn, agent, model, prompt
    tokens, response tokens]`` per call; the turn is the lock-step slot)."""
    doc = json.loads(Path(path).read_text())
    return [[tuple(Call(m, p, r, t) for t, _agent, m, p, r in ep) for ep in it] for it in doc["iterations"]]


#: Measured on the 2-core development machine, one torch thread, SmolLM2-135M-Instruct (docs/rollout-performance.md
#: and docs/update-performance.md): the lock-step rollout of 128 calls x 64 new tokens (16,555 prompt tokens
#: prefilled) took 115.9 s; drmas's update ran 100-104 prompt + completion tokens/s. The split of the 115.9 s
#: between prefill and decode was not measured: prefill is taken as 4x faster per token than decode (assumption:
#: one batched forward over all prompt tokens against one small forward per decoded token).
CPU_QUICKSTART = {"decode_tok_s": (8192 + 16555 / 4) / 115.9, "prefill_tok_s": 4 * (8192 + 16555 / 4) / 115.9,
                  "update_tok_s": 102.0, "sync_s": 0.0}  # fmt: skip


def cpu_check(eta: int = 1) -> dict[str, Any]:
    """The quickstart (quickstart_math: SmolLM2, 4 tasks x 4 episodes, measured call lengths) on CPU, predicted:

    * ``same_core``: one thread does everything; sync vs async with generation and update taking turns on it;
    * ``two_cores_1_thread_each``: sync as a Ray run with ``cpus_per_worker: 1`` (a generation worker and a
      training rank, one thread each, taking turns) vs async with one core generating and one training;
    * ``two_cores_both_threads``: sync with both threads on each phase (linear scaling assumed: optimistic for sync,
      the measured 2-thread speed-up of generation is 1.72x, docs/scaling.md section 6) vs the same async.
    """
    batches = load_episodes()
    models = sorted({c.model for b in batches for ep in b for c in ep})
    costs = MeasuredCosts(
        CPU_QUICKSTART["decode_tok_s"], CPU_QUICKSTART["prefill_tok_s"], CPU_QUICKSTART["update_tok_s"]
    )
    sync1 = simulate_sync(batches, models, 1, costs, warmup=1)
    sync2 = simulate_sync(batches, models, 2, costs, warmup=1)
    ahead = batches + batches[:eta]  # generation runs ahead into eta more batches (the measured ones again)
    k = len(batches)
    col = simulate_async(ahead, models, 1, costs, eta=eta, warmup=1, measure=k)
    split = simulate_async(
        ahead, models, 2, costs, eta=eta, placement="split", gen_gpus=1, warmup=1, measure=k
    )

    def case(sync: dict[str, float], asy: dict[str, float]) -> dict[str, float]:
        return {"sync_s_per_iter": round(sync["s_per_iter"], 1), "sync_rollout_s": round(sync["rollout_s"], 1),
                "sync_update_s": round(sync["update_s"], 1), "async_s_per_iter": round(asy["s_per_iter"], 1),
                "ratio_sync_over_async": round(sync["s_per_iter"] / asy["s_per_iter"], 2)}  # fmt: skip

    return {"rates": {k: round(v, 1) for k, v in CPU_QUICKSTART.items()}, "eta": eta,
            "same_core": case(sync1, col), "two_cores_1_thread_each": case(sync1, split),
            "two_cores_both_threads": case(sync2, split),
            "measured_sync": "rollout 13-22 s, update 13-42 s per iteration, 2 threads, idle machine (docs/quickstart.md)",
            "measured_async": "pending: run.mode async does not overlap generation and training yet"}  # fmt: skip


# ---------------------------------------------------------------------------------------------------- the CLI


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--setup", action="append", choices=sorted(SETUPS), help="one setup (repeatable); default all"
    )
    p.add_argument("--eta", type=int, nargs="+", default=[1, 2], help="staleness bounds to simulate")
    p.add_argument("--iterations", type=int, default=8, help="iterations simulated (the first 2 are warm-up)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--groups", type=int, default=None, help="prompt groups per iteration (default: the setup's)"
    )
    p.add_argument("--hardware", choices=["H100", "H200"], default="H100", help="GPU of every setup")
    p.add_argument("--retrieval-s", type=float, default=None, help="seconds per search call (search setups)")
    p.add_argument("--length-scale", type=float, default=1.0, help="multiply every median response length")
    p.add_argument("--markdown", action="store_true", help="print the doc's Markdown table instead of JSON")
    p.add_argument("--cpu-check", action="store_true", help="the CPU quickstart's predicted sync/async ratio")
    args = p.parse_args(argv)
    if (
        args.iterations < 3
        or any(e < 0 for e in args.eta)
        or (args.retrieval_s is not None and args.retrieval_s < 0)
        or (args.groups is not None and args.groups < 1)
        or args.length_scale <= 0
    ):
        print(
            "async_sim: need --iterations >= 3, --groups >= 1, --eta >= 0, --retrieval-s >= 0, --length-scale > 0",
            file=sys.stderr,
        )
        return 2
    if args.cpu_check:
        print(json.dumps(cpu_check(args.eta[0])))
        return 0
    setups = []
    for name in args.setup or list(SETUPS):
        s = dataclasses.replace(SETUPS[name], hardware={"H100": H100, "H200": H200}[args.hardware])
        if args.groups is not None:
            s = dataclasses.replace(s, groups=args.groups)
        if args.length_scale != 1.0:
            s = dataclasses.replace(s, episodes=scale_lengths(s.episodes, args.length_scale))
        if args.retrieval_s is not None and isinstance(s.episodes, SearchEpisodes):
            s = dataclasses.replace(s, episodes=dataclasses.replace(s.episodes, retrieval_s=args.retrieval_s))
        setups.append(s)
    rows = [compare(s, args.eta, args.iterations, args.seed) for s in setups]
    if args.markdown:
        print(markdown(rows))
    else:
        print(json.dumps({"roofline_check": roofline_check(), "hardware": args.hardware, "iterations": args.iterations,
                          "seed": args.seed, "retrieval_s": args.retrieval_s, "length_scale": args.length_scale,
                          "rows": rows}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
