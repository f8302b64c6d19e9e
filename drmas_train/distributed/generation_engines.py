"""The generation engines of one model: one HF (:class:`~drmas_train.distributed.workers.GenerationWorker`) or vLLM
(:class:`~drmas_train.distributed.vllm_worker.VLLMGenerationWorker`) actor per bundle of the resource pool.

Jobs:

* **generate**: the rows of one batched call are cut into one contiguous chunk per engine (equal prompts stay
  together, so the HF engine still prefills them once); chunk ``i`` samples with a seed derived from the call's
  seed and ``i`` (a single chunk keeps the call's seed: 1 engine == the single process).
* **weights**: :meth:`GenerationEngines.push` gives every engine the current weights (an object-store ref, tagged
  with a version), waiting while Ray restarts an engine (tenacity, bounded by ``restart_timeout_s``).
* **sleep**: vLLM engines share their bundle's GPU with a training rank: :meth:`GenerationEngines.sleep` frees their
  memory before the ranks train, and the next push wakes them (weights, load, then KV cache).
* **faults**: engines are Ray actors with ``max_restarts``. A chunk whose engine died (or came back with its initial
  weights, caught by the version check) is re-issued after the current weights are pushed again, with the same
  seed, so its rows come back exactly once and as they would have without the fault. Each fault is logged (which
  engine, during what, how many calls re-issued) and counted (:attr:`GenerationEngines.restarts`,
  :attr:`GenerationEngines.reissued_calls`); more than ``max_restarts`` faults raise
  :class:`~drmas_train.distributed.errors.DistributedError`.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import ActorUnavailableError, RayActorError
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from drmas_train.distributed.config import GENERATION_ENGINES
from drmas_train.distributed.errors import DistributedError
from drmas_train.distributed.resource_pool import ResourcePool
from drmas_train.distributed.vllm_worker import VLLMGenerationWorker
from drmas_train.distributed.workers import GenerationWorker, StaleWeightsError

__all__ = ["GenerationEngines", "chunk_seed", "vllm_runtime_env"]

logger = logging.getLogger(__name__)


def chunk_seed(seed: int | None, chunk: int, n_chunks: int) -> int | None:
    """Sampling seed of chunk ``chunk`` of a call seeded ``seed`` (unchanged with one chunk, or no seed)."""
    if seed is None or n_chunks == 1:
        return seed
    return random.Random(f"drmas-chunk-{seed}-{chunk}").getrandbits(63)


def vllm_runtime_env(python: str | None = None, *, cpu: bool = False) -> dict[str, Any]:
    """Ray ``runtime_env`` of a vLLM generation engine actor.

    ``env_vars``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core in the actor's process: weights are pushed
    to it as Python objects); on CPU engines also ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; the driver's value,
    default 1: vLLM's CPU default sizes it from the free host memory, too much for engines sharing one machine).
    ``py_executable``: ``python`` when given, so the actor runs in a separate venv that has vLLM (e.g. ``vllm-cpu``,
    which pins its own torch/transformers); that venv needs the driver's Ray version and drmas importable.
    """
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    runtime_env: dict[str, Any] = {"env_vars": env}
    if python:
        runtime_env["py_executable"] = str(python)
    return runtime_env


class GenerationEngines:
    """The generation engines of model ``model_id`` on ``bundles`` of ``pool``.

    Args:
        model_id, spec, pool, bundles, share, loader, threads: as :class:`~drmas_train.distributed.worker_group.WorkerGroup`.
        max_restarts: engine restarts (all engines of the model, the whole run). backend_kwargs: HF engine arguments.
        engine: ``hf`` | ``vllm`` (GPU bundles, or CPU ones with ``vllm_allow_cpu``). engine_kwargs: ``vllm.LLM``
            arguments (``engine="vllm"``). sleep_level: ``LLM.sleep`` level of the vLLM engines (1 or 2).
        vllm_allow_cpu: allow vLLM's CPU build on CPU bundles (no sleep mode; rehearsals and checks).
        vllm_python: interpreter of the vLLM engines (:func:`vllm_runtime_env`); None: the driver's.

    Attributes:
        restarts: engine faults so far (each one restart). reissued_calls: calls (rows) re-issued after faults.
        context: what the run is doing, for fault messages (e.g. ``"iteration 7"``; set by the updater).

    Raises:
        ValueError: an unknown ``engine``, or ``vllm`` on a pool without GPUs and without ``vllm_allow_cpu``.
    """

    def __init__(self, model_id: str, spec: Any, pool: ResourcePool, bundles: Sequence[int], *, share: int = 2,
                 loader: Callable | None = None, threads: int = 1, max_restarts: int = 2,
                 backend_kwargs: dict[str, Any] | None = None, engine: str = "hf",
                 engine_kwargs: dict[str, Any] | None = None, sleep_level: int = 1, vllm_allow_cpu: bool = False,
                 vllm_python: str | None = None) -> None:  # fmt: skip
        if engine not in GENERATION_ENGINES:
            raise ValueError(f"unknown generation engine {engine!r}; accepted: {list(GENERATION_ENGINES)}")
        if engine == "vllm" and pool.gpus == 0 and not vllm_allow_cpu:
            raise ValueError("generation engine 'vllm' needs GPU bundles (vLLM's sleep mode is CUDA-only); "
                             "use engine 'hf' on a CPU pool, or vLLM's CPU build with vllm_allow_cpu=True")  # fmt: skip
        self.model_id, self.engine, self.max_restarts = model_id, engine, int(max_restarts)
        self.restarts = self.reissued_calls = 0
        self.context = "start-up"
        self.restart_timeout_s = 300.0  # how long a restarting engine may take to come back
        options: dict[str, Any] = {}
        if engine == "vllm":
            actor, kwargs = ray.remote(VLLMGenerationWorker), dict(engine_kwargs=engine_kwargs, sleep_level=sleep_level)
            options["runtime_env"] = vllm_runtime_env(vllm_python, cpu=pool.gpus == 0)
        else:
            actor, kwargs = ray.remote(GenerationWorker), dict(backend_kwargs=backend_kwargs)
        self.actors = [
            actor.options(max_restarts=self.max_restarts, max_task_retries=0, **options,
                          **pool.actor_options(b, share)).remote(
                spec, model_id, loader=loader, threads=threads, use_gpu=pool.gpus > 0, **kwargs)
            for b in bundles
        ]  # fmt: skip
        self.weights_ref: Any = None
        self.version = -1

    def sleep(self) -> None:
        """Release the vLLM engines' GPU memory (``LLM.sleep``) before training ranks on the same GPUs run;
        idempotent, a no-op for HF engines. The next :meth:`push` wakes them. An engine that died meanwhile is
        skipped: Ray restarts it asleep and stale, and the next call re-pushes weights to it (which wakes it)."""
        if self.engine != "vllm":
            return
        for ref in [g.sleep.remote() for g in self.actors]:
            try:
                ray.get(ref)
            except (RayActorError, ActorUnavailableError):
                continue

    def push(self, weights_ref: Any, version: int) -> None:
        """Give every engine the weights ``weights_ref`` (an object-store ref to a full state dict) as ``version``."""
        self.weights_ref, self.version = weights_ref, version
        for w in range(len(self.actors)):
            self._push(w)

    def _push(self, w: int) -> None:
        """Give engine ``w`` the current weights, waiting (up to ``restart_timeout_s``) while Ray restarts it.

        Raises:
            DistributedError: the engine is dead for good (Ray's ``max_restarts`` spent) or never came back.
        """
        try:
            for attempt in Retrying(retry=retry_if_exception_type(ActorUnavailableError), stop=stop_after_delay(self.restart_timeout_s),
                                    wait=wait_exponential(multiplier=0.1, max=2.0)):  # fmt: skip
                with attempt:
                    ray.get(self.actors[w].load_weights.remote(self.weights_ref, self.version))
        except (RayActorError, RetryError) as err:
            raise DistributedError(
                f"generation worker {w} of model {self.model_id!r} is gone (dead after Ray's max_restarts="
                f"{self.max_restarts}, or not back within {self.restart_timeout_s:.0f} s): {err}") from err  # fmt: skip

    def _fault(self, w: int, rows: int, err: BaseException) -> None:
        """Count and log one engine fault whose ``rows`` calls are re-issued.

        Raises:
            DistributedError: more faults than ``max_restarts``.
        """
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise DistributedError(
                f"generation worker {w} of model {self.model_id!r} failed again after {self.max_restarts} restarts "
                f"(distributed.max_restarts) during {self.context}; last error: {err}") from err  # fmt: skip
        self.reissued_calls += rows
        why = "came back with stale weights" if isinstance(err, StaleWeightsError) else "died"
        logger.warning("generation worker %d of model %r %s during %s; re-issuing its %d call(s) with the same seed "
                       "(restart %d of at most %d)", w, self.model_id, why, self.context, rows, self.restarts,
                       self.max_restarts)  # fmt: skip

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
        """``len(prompt_ids) * sampling.n`` generations, prompt-major, spread over the engines.

        Raises:
            DistributedError: an engine failed more often than ``max_restarts`` allows.
        """
        bounds = np.array_split(np.arange(len(prompt_ids)), min(len(self.actors), max(len(prompt_ids), 1)))
        chunks = [[list(prompt_ids[i]) for i in b] for b in bounds if len(b)]
        params = [sampling.replace(seed=chunk_seed(sampling.seed, i, len(chunks))) for i in range(len(chunks))]
        pending = {self.actors[i].generate_ids.remote(chunks[i], params[i], self.version): i for i in range(len(chunks))}
        results: dict[int, list[Any]] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                results[i] = ray.get(done[0])
                continue
            except (RayActorError, StaleWeightsError) as err:  # died mid-call, or came back with old weights
                self._fault(i, len(chunks[i]) * sampling.n, err)  # one per death: waiting through the restart is _push's
            self._push(i)
            pending[self.actors[i].generate_ids.remote(chunks[i], params[i], self.version)] = i
        return [g for i in range(len(chunks)) for g in results[i]]

    def pids(self) -> list[int]:
        """Process ids of the engines (fault-injection tests kill them)."""
        return ray.get([g.pid.remote() for g in self.actors])

    def close(self) -> None:
        """Kill the engines (idempotent)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
