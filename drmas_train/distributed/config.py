"""The ``distributed`` section of the training config: scale-out on Ray (off by default), and its one list of
data-parallel strategies and generation engines."""

from __future__ import annotations

import difflib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from drmas_train.errors import ConfigError, require

__all__ = ["DistributedConfig", "STRATEGIES", "GENERATION_ENGINES", "RANK_HOST_MEMORY"]

#: accepted ``distributed.strategy`` values (``auto`` resolves to one of the others,
#: :func:`drmas_train.distributed.data_parallel.resolve_strategy`).
STRATEGIES = ("auto", "fsdp2", "ddp")
#: accepted ``distributed.generation_engine`` values (see :class:`DistributedConfig`).
GENERATION_ENGINES = ("hf", "vllm")
#: accepted ``distributed.rank_host_memory`` values (:class:`~drmas_train.distributed.workers.TrainWorker`)
RANK_HOST_MEMORY = ("release", "keep")


@dataclass
class DistributedConfig:
    """Scale-out on Ray (:mod:`drmas_train.distributed`); off by default: the single-process path is unchanged.

    Each model gets one worker group: ``world_size[model]`` training ranks (one ``torch.distributed`` process
    group, gloo on CPU, NCCL on GPU) and as many generation workers, placed on the bundles of one resource pool
    (one bundle = ``cpus_per_worker`` CPUs and, on GPU nodes, one GPU).
    """

    enabled: bool = False
    """train through Ray worker groups instead of in this process."""
    address: str | None = None
    """null: start a local Ray (127.0.0.1 only, no dashboard unless ``dashboard``); else ``ray.init(address=...)``
    (e.g. ``auto`` or ``ray://head:10001``)."""
    num_nodes: int = 1
    """nodes the pool spans (>= 1)."""
    devices_per_node: int = 0
    """GPUs per node, one per bundle; 0 = CPU-only workers (gloo), one bundle per ``cpus_per_worker`` CPUs."""
    cpus_per_worker: int = 1
    """CPUs per bundle (>= 1); also the torch threads of each worker."""
    colocate: bool = True
    """every model's worker group on the same bundles, taking turns (Dr. MAS shared resource scheduling);
    false = the pool is split between the models."""
    world_size: dict[str, int] = field(default_factory=dict)
    """model key -> training ranks (default: all bundles when colocated, else an even split)."""
    strategy: str = "auto"
    """``auto`` | ``fsdp2`` | ``ddp``; auto = FSDP2 ``fully_shard`` (works on CUDA/NCCL and, with torch >= 2.6,
    on CPU/gloo), or the plain module for a model trained by one rank (nothing to shard; its update then shares
    prompts as the single process does)."""
    rank_host_memory: str = "release"
    """what a training rank does with the host memory its update frees (``malloc``; :mod:`drmas_train.distributed.host_memory`):
    ``release`` gives it back to the OS (glibc's mmap threshold fixed at 128 KiB, ``malloc_trim`` after each update),
    so a rank holds little between updates; ``keep`` leaves glibc's defaults, as a single process runs: the rank holds
    its freed activations and reuses them. On CPU ranks ``release`` costs speed, since every activation then
    faults its pages in afresh: inside a one-rank SmolLM2 update (``benchmarks/perf/distributed.py``) the rank took
    1.52x the single process's time with ``release`` and 1.03x with ``keep`` (docs/scaling.md, "The one-rank
    update"). CUDA activations do not come from ``malloc``, so on GPU ranks it matters little."""
    max_restarts: int = 2
    """bounded restarts per run: of generation workers (Ray ``max_restarts``; their owed calls are re-issued) and
    of training groups (rebuilt from the latest checkpoint, the trainer replays from it)."""
    dashboard: bool = False
    """start the Ray dashboard with a local Ray."""
    generation_engine: str = "hf"
    """generation workers: ``hf`` (transformers, CPU or GPU) or ``vllm`` (GPU workers, ``devices_per_node > 0``, unless
    ``vllm_allow_cpu``; sleeps while the training ranks on its GPU run, :mod:`drmas_train.distributed.vllm_worker`)."""
    vllm_allow_cpu: bool = False
    """allow ``generation_engine: vllm`` on CPU-only workers (``devices_per_node: 0``) with vLLM's CPU build: for dress
    rehearsals and checks of the vLLM path on a machine without GPUs (slow; no sleep mode on CPU, so the engines
    stay awake beside the training ranks). See ``drmas_train.distributed.vllm_cpu``."""
    vllm_python: str | None = None
    """the Python interpreter of the vLLM generation workers (Ray ``runtime_env.py_executable``): a separate venv with
    vLLM, the driver's Ray version and drmas (``scripts/vllm_cpu_check.sh`` builds one with ``vllm-cpu``). null: the
    driver's interpreter."""
    vllm_gpu_memory_utilization: float = 0.5
    """the share of each GPU, in (0, 1], that the awake vLLM engines on it take together (weights + KV cache); with
    ``colocate: true`` each model's engine gets ``1 / models`` of it (``vllm.LLM(gpu_memory_utilization=...)``). It
    must fit beside the training ranks' resident state (docs/scaling.md)."""
    vllm_sleep_level: int = 1
    """``LLM.sleep(level)`` before each update: 1 = weights to CPU memory, 2 = weights dropped (less host memory;
    every push overwrites them anyway)."""
    vllm_kwargs: dict[str, Any] = field(default_factory=dict)
    """more ``vllm.LLM`` arguments (``enforce_eager``, ``max_model_len`` (default: ``rollout.max_prompt_tokens +
    rollout.max_new_tokens``), ``enable_prefix_caching``, ...)."""

    def validate(self, models: Collection[str]) -> None:
        """Check this section; ``models``: the model keys of the config (``world_size`` may only name them).

        Raises:
            ConfigError: naming the key (``distributed.<field>``), the bad value and what is accepted.
        """
        for key in ("num_nodes", "cpus_per_worker"):
            require(getattr(self, key) >= 1, f"distributed.{key} must be >= 1, got {getattr(self, key)}")
        require(self.devices_per_node >= 0,
                f"distributed.devices_per_node must be >= 0 (0 = CPU-only), got {self.devices_per_node}")  # fmt: skip
        require(self.max_restarts >= 0, f"distributed.max_restarts must be >= 0, got {self.max_restarts}")
        require(self.strategy in STRATEGIES, f"distributed.strategy={self.strategy!r}; accepted: {list(STRATEGIES)}")
        require(self.rank_host_memory in RANK_HOST_MEMORY,
                f"distributed.rank_host_memory={self.rank_host_memory!r}; accepted: {list(RANK_HOST_MEMORY)}")  # fmt: skip
        require(self.generation_engine in GENERATION_ENGINES,
                f"distributed.generation_engine={self.generation_engine!r}; accepted: {list(GENERATION_ENGINES)}")  # fmt: skip
        require(0 < self.vllm_gpu_memory_utilization <= 1,
                f"distributed.vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")  # fmt: skip
        require(self.vllm_sleep_level in (1, 2), f"distributed.vllm_sleep_level must be 1 or 2, got {self.vllm_sleep_level}")
        for key, n in self.world_size.items():
            if key not in models:
                close = difflib.get_close_matches(str(key), models, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"distributed.world_size.{key} names no model; defined models: {sorted(models)}.{hint}")
            require(isinstance(n, int) and not isinstance(n, bool) and n >= 1,
                    f"distributed.world_size.{key} must be an int >= 1, got {n!r}")  # fmt: skip
        if self.enabled and self.generation_engine == "vllm":
            require(self.devices_per_node > 0 or self.vllm_allow_cpu, "distributed.generation_engine=vllm needs GPU "
                    "workers (distributed.devices_per_node > 0): vLLM and its sleep mode run on CUDA; on CPU-only "
                    "workers use distributed.generation_engine=hf, or vLLM's CPU build with "
                    "distributed.vllm_allow_cpu=true (rehearsals and checks)")  # fmt: skip
