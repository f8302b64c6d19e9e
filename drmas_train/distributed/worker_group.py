"""One model's worker group: ``N`` training ranks (one ``torch.distributed`` process group) and ``N``
generation workers, one of each per bundle of the resource pool.

* **update**: every rank gets the model's samples (one object-store copy) and runs its share of the PPO update
  (:func:`~drmas_train.distributed.data_parallel.dp_ppo_update`); then :meth:`WorkerGroup.publish` pushes the
  new weights trainer -> generation engines in memory (rank 0's full state dict through Ray's shared-memory
  object store).
* **engines**: ``engine="hf"`` (:class:`~drmas_train.distributed.workers.GenerationWorker`, CPU or GPU) or
  ``engine="vllm"`` (:class:`~drmas_train.distributed.vllm_worker.VLLMGenerationWorker`, GPU; on CPU bundles only
  with ``vllm_allow_cpu``, vLLM's CPU build, no sleep mode). A vLLM engine shares
  its bundle's GPU with the training rank beside it, so :meth:`WorkerGroup.start_update` first puts the group's
  engines to sleep (:meth:`WorkerGroup.sleep_engines`: weights offloaded, KV cache freed) and the push after the
  update wakes them (weights, load, then KV cache): sleep -> update -> wake_up + load_weights.
* **generate**: the rows of one batched call are cut into one contiguous chunk per generation worker (equal
  prompts stay together, so the HF engine still prefills them once); chunk ``i`` samples with a seed derived
  from the call's seed and ``i`` (a single chunk keeps the call's seed: 1 worker == single process).
* **faults**: generation workers are Ray actors with ``max_restarts``; a chunk whose worker died (or came back
  with its initial weights) is re-issued after the current weights are pushed again — with the same seed, so
  the rows come back exactly once and as they would have without the fault. More failures than
  ``max_restarts`` raise :class:`~drmas_train.distributed.cluster.DistributedError`. Training ranks are not
  restarted by Ray: a dead rank ends the step with a :class:`DistributedError`; the updater
  (:meth:`~drmas_train.distributed.updater.RayUpdater.recover`) rebuilds the group from the latest checkpoint.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.distributed.cluster import DistributedError
from drmas_train.distributed.resource_pool import ResourcePool
from drmas_train.distributed.workers import GenerationWorker, StaleWeightsError, TrainWorker
from drmas_train.run.config import GENERATION_ENGINES

__all__ = ["WorkerGroup", "chunk_seed", "vllm_runtime_env"]


def chunk_seed(seed: int | None, chunk: int, n_chunks: int) -> int | None:
    """Sampling seed of chunk ``chunk`` of a call seeded ``seed`` (unchanged with one chunk, or no seed)."""
    if seed is None or n_chunks == 1:
        return seed
    return random.Random(f"drmas-chunk-{seed}-{chunk}").getrandbits(63)


def vllm_runtime_env(python: str | None = None, *, cpu: bool = False) -> dict[str, Any]:
    """Ray ``runtime_env`` of a vLLM generation worker actor.

    ``env_vars``: ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the engine core in the actor's process: weights are pushed
    to it as Python objects); on CPU workers also ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache; the driver's value,
    default 1: vLLM's CPU default sizes it from the free host memory, too much for workers sharing one machine).
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


class WorkerGroup:
    """Training ranks + generation workers of one model on ``bundles`` of ``pool``.

    Args:
        model_id: the pool's model id. spec: its :class:`~drmas_train.model.models.ModelSpec`.
        pool: the resource pool. bundles: bundle index of each rank (``len(bundles)`` = world size).
        share: actors living on each bundle (2 per colocated group) — each asks Ray for ``1/share`` of it.
        loader: ``(spec, model_id) -> LoadedModel`` importable by the workers (None: ``load_model``).
        optim_kwargs: :func:`~drmas_train.algorithm.optim.build_optimizer` arguments. kl: keep a frozen reference.
        strategy: ``auto`` | ``fsdp2`` | ``ddp``. threads: torch threads per worker.
        max_restarts: generation worker restarts (whole group, whole run). backend_kwargs: HF engine arguments.
        engine: ``hf`` | ``vllm`` (GPU bundles, or CPU ones with ``vllm_allow_cpu``). engine_kwargs: ``vllm.LLM``
            arguments (``engine="vllm"``). sleep_level: ``LLM.sleep`` level of the vLLM engines (1 or 2).
        vllm_python: interpreter of the vLLM generation workers (:func:`vllm_runtime_env`); None: the driver's.

    Raises:
        ValueError: an unknown ``engine``, or ``vllm`` on a pool without GPUs and without ``vllm_allow_cpu``.
        DistributedError: a rank failed to start (its error chained).
    """

    def __init__(self, model_id: str, spec: Any, pool: ResourcePool, bundles: Sequence[int], *, share: int = 2,
                 loader: Callable | None = None, optim_kwargs: dict[str, Any] | None = None, kl: bool = False,
                 strategy: str = "auto", threads: int = 1, max_restarts: int = 2,
                 backend_kwargs: dict[str, Any] | None = None, engine: str = "hf",
                 engine_kwargs: dict[str, Any] | None = None, sleep_level: int = 1, vllm_allow_cpu: bool = False,
                 vllm_python: str | None = None) -> None:  # fmt: skip
        import ray

        if engine not in GENERATION_ENGINES:
            raise ValueError(f"unknown generation engine {engine!r}; accepted: {list(GENERATION_ENGINES)}")
        if engine == "vllm" and pool.gpus == 0 and not vllm_allow_cpu:
            raise ValueError("generation engine 'vllm' needs GPU bundles (vLLM's sleep mode is CUDA-only); "
                             "use engine 'hf' on a CPU pool, or vLLM's CPU build with vllm_allow_cpu=True")  # fmt: skip

        self.model_id, self.max_restarts, self.restarts = model_id, int(max_restarts), 0
        self.restart_timeout_s = 300.0  # how long a restarting generation worker may take to come back
        self.world_size = len(bundles)
        use_gpu = pool.gpus > 0
        self.engine = engine
        if engine == "vllm":
            from drmas_train.distributed.vllm_worker import VLLMGenerationWorker

            gen_cls = ray.remote(VLLMGenerationWorker)
            gen_kwargs = dict(engine_kwargs=engine_kwargs, sleep_level=sleep_level)
            gen_options = {"runtime_env": vllm_runtime_env(vllm_python, cpu=not use_gpu)}
        else:
            gen_cls, gen_kwargs = ray.remote(GenerationWorker), dict(backend_kwargs=backend_kwargs)
            gen_options = {}
        train_cls = ray.remote(TrainWorker)
        self.trainers = [
            train_cls.options(max_restarts=0, **pool.actor_options(b, share)).remote(
                spec, model_id, rank, self.world_size, loader=loader, optim_kwargs=optim_kwargs, kl=kl,
                strategy=strategy, threads=threads, use_gpu=use_gpu)
            for rank, b in enumerate(bundles)
        ]  # fmt: skip
        self.generators = [
            gen_cls.options(max_restarts=self.max_restarts, max_task_retries=0, **gen_options,
                            **pool.actor_options(b, share)).remote(
                spec, model_id, loader=loader, threads=threads, use_gpu=use_gpu, **gen_kwargs)
            for b in bundles
        ]  # fmt: skip
        try:
            addr, port = ray.get(self.trainers[0].address.remote())
            self.strategy = ray.get([t.setup.remote(addr, port) for t in self.trainers])[0]
        except Exception as err:
            self.close()
            raise DistributedError(f"worker group {model_id!r} ({self.world_size} ranks) failed to start: {err}") from err
        self.version, self.weights_ref = -1, None
        self.publish()

    # ---- training ------------------------------------------------------------------------------------------
    def _get_ranks(self, refs: list[Any], what: str) -> list[Any]:
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(refs)
        except RayActorError as err:
            raise DistributedError(
                f"a training rank of model {self.model_id!r} died during {what}; the step is lost. Resume from the "
                f"latest complete checkpoint with `drmas train --resume` (cause: {err})") from err  # fmt: skip

    def update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, update_kwargs: dict[str, Any]) -> dict[str, float]:
        """PPO update on every rank, then :meth:`publish`. Returns the metrics (reduced over ranks).

        Raises:
            DistributedError: a training rank died.
        """
        return self.finish_update(self.start_update(samples, advantages, seed, update_kwargs))

    def start_update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, update_kwargs: dict[str, Any],
                     recompute_old_logprobs: bool = False) -> list[Any]:
        """Submit the update to every rank without waiting (groups on disjoint bundles then train at once); with
        ``recompute_old_logprobs`` the ranks first recompute π_old with the training weights. vLLM engines are put
        to sleep first (:meth:`sleep_engines`), so the ranks train with the GPU memory the engines held."""
        import ray

        self.sleep_engines()
        # one object-store copy for all ranks; Ray resolves top-level ObjectRef arguments on the worker
        samples_ref, adv_ref = ray.put(list(samples)), ray.put(np.asarray(advantages))
        return [t.update.remote(samples_ref, adv_ref, seed, update_kwargs, recompute_old_logprobs) for t in self.trainers]

    def finish_update(self, refs: list[Any], *, publish: bool = True) -> dict[str, float]:
        """Wait for :meth:`start_update`'s ranks, then :meth:`publish` (unless ``publish=False``: the caller
        publishes later, e.g. after every colocated group's update); returns rank 0's (reduced) metrics."""
        metrics = self._get_ranks(refs, "the update")[0]
        if publish:
            self.publish()
        return metrics

    def sleep_engines(self) -> None:
        """Release the vLLM engines' GPU memory (``LLM.sleep``) before training ranks on the same GPUs run;
        idempotent, a no-op for HF engines. The next :meth:`publish` wakes them. A worker that died meanwhile is
        skipped: Ray restarts it asleep and stale, and the next call re-pushes weights to it (which wakes it)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if self.engine != "vllm":
            return
        for ref in [g.sleep.remote() for g in self.generators]:
            try:
                ray.get(ref)
            except (RayActorError, ActorUnavailableError):
                continue

    def publish(self) -> None:
        """Push the training ranks' current weights to every generation worker (in memory, new version)."""
        replies = self._get_ranks([t.publish_weights.remote() for t in self.trainers], "the weight gather")  # collective
        self.weights_ref, self.version = replies[0][0], self.version + 1  # rank 0's object: the driver never copies it
        for w in range(len(self.generators)):
            self._push(w)

    def _push(self, w: int) -> None:
        """Give worker ``w`` the current weights, waiting (up to ``restart_timeout_s``) while Ray restarts it.

        Raises:
            DistributedError: the worker is dead for good (Ray's ``max_restarts`` spent) or never came back.
        """
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

        try:
            for attempt in Retrying(retry=retry_if_exception_type(ActorUnavailableError), stop=stop_after_delay(self.restart_timeout_s),
                                    wait=wait_exponential(multiplier=0.1, max=2.0)):  # fmt: skip
                with attempt:
                    ray.get(self.generators[w].load_weights.remote(self.weights_ref, self.version))
        except (RayActorError, RetryError) as err:
            raise DistributedError(
                f"generation worker {w} of model {self.model_id!r} is gone (dead after Ray's max_restarts="
                f"{self.max_restarts}, or not back within {self.restart_timeout_s:.0f} s): {err}") from err  # fmt: skip

    def _count_restart(self, w: int, err: BaseException) -> None:
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise DistributedError(
                f"generation worker {w} of model {self.model_id!r} failed again after {self.max_restarts} restarts "
                f"(distributed.max_restarts); last error: {err}") from err  # fmt: skip

    # ---- generation ----------------------------------------------------------------------------------------
    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
        """``len(prompt_ids) * sampling.n`` generations, prompt-major, spread over the generation workers.

        Raises:
            DistributedError: a worker failed more often than ``max_restarts`` allows.
        """
        import ray
        from ray.exceptions import RayActorError

        bounds = np.array_split(np.arange(len(prompt_ids)), min(len(self.generators), max(len(prompt_ids), 1)))
        chunks = [[list(prompt_ids[i]) for i in b] for b in bounds if len(b)]
        params = [sampling.replace(seed=chunk_seed(sampling.seed, i, len(chunks))) for i in range(len(chunks))]
        pending = {self.generators[i].generate_ids.remote(chunks[i], params[i], self.version): i for i in range(len(chunks))}
        results: dict[int, list[Any]] = {}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(done[0])
            try:
                results[i] = ray.get(done[0])
                continue
            except (RayActorError, StaleWeightsError) as err:  # died mid-call, or came back with old weights
                self._count_restart(i, err)  # one per death: waiting through the restart is _push's job
            self._push(i)
            pending[self.generators[i].generate_ids.remote(chunks[i], params[i], self.version)] = i
        return [g for i in range(len(chunks)) for g in results[i]]

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, Any]:
        """The current full weights (those the generation workers hold)."""
        import ray

        return ray.get(self.weights_ref)

    def save(self, path: str | Path) -> None:
        """Sharded checkpoint (model + optimizer, ``torch.distributed.checkpoint``) of every rank under ``path``."""
        self._get_ranks([t.save.remote(str(path)) for t in self.trainers], "the checkpoint save")

    def save_hf(self, path: str | Path) -> None:
        """The current weights as a Hugging Face folder at ``path``, written by rank 0 (``TrainWorker.save_hf``)."""
        self._get_ranks([t.save_hf.remote(str(path)) for t in self.trainers], "the Hugging Face export")

    def load(self, path: str | Path) -> None:
        """Inverse of :meth:`save`, then :meth:`publish`."""
        self._get_ranks([t.load.remote(str(path)) for t in self.trainers], "the checkpoint load")
        self.publish()

    def generator_pids(self) -> list[int]:
        """Process ids of the generation workers (fault-injection tests kill them)."""
        import ray

        return ray.get([g.pid.remote() for g in self.generators])

    def close(self) -> None:
        """Kill the group's actors (idempotent)."""
        import ray

        for actor in [*self.trainers, *self.generators]:
            ray.kill(actor, no_restart=True)
        self.trainers, self.generators = [], []

