"""The two Ray actors of a worker group: a training rank and a generation worker (plain classes here; the
worker group turns them into actors with ``ray.remote``).

* :class:`TrainWorker` — one rank of the model's ``torch.distributed`` process group (gloo on CPU, NCCL on GPU):
  its FSDP2 shard (or DDP replica) of the model, its AdamW, a frozen reference when a KL term is on, and PPO's
  critics of the model's agents (each a :class:`~drmas_train.model.value_model.ValueModel` sharded or replicated
  over the same ranks, with its own AdamW).
* :class:`GenerationWorker` — the HF engine (:class:`drmas_train.backends.hf.HFBackend`) over a full copy of the
  weights. After every update the group pushes rank 0's full state dict to it through Ray's shared-memory
  object store (never through files), tagged with a version; a call that expects another version (a worker
  that Ray restarted with its initial weights) fails with :class:`StaleWeightsError` and is re-issued after a
  push. vLLM engines would take this class's place on GPUs (same three methods; its sleep / wake-up would
  free the memory while the training ranks run).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from drmas_train.algorithm.critic import critic_values, value_update
from drmas_train.algorithm.old_logprobs import recompute_old_logprobs
from drmas_train.algorithm.optim import build_optimizer
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import update_policy
from drmas_train.backends.hf import HFBackend
from drmas_train.distributed.checkpoint import load_sharded, save_sharded
from drmas_train.distributed.config import RANK_HOST_MEMORY
from drmas_train.distributed.data_parallel import (
    rank_hooks,
    rank_settings,
    resolve_strategy,
    unwrap_ddp,
    wrap_model,
)
from drmas_train.distributed.host_memory import cap_mmap_threshold, peak_rss_mb, release_freed_memory
from drmas_train.model.models import load_model
from drmas_train.model.precision import frozen_copy
from drmas_train.model.value_model import ValueModel
from drmas_train.model.weights import save_folder

__all__ = ["TrainWorker", "GenerationWorker", "StaleWeightsError", "worker_device"]


class StaleWeightsError(RuntimeError):
    """A generation worker was asked to sample with a weight version it does not hold (it was restarted)."""


def worker_device(use_gpu: bool) -> torch.device:
    """``cuda:0`` (Ray sets ``CUDA_VISIBLE_DEVICES`` to the bundle's GPU) or ``cpu``."""
    return torch.device("cuda", 0) if use_gpu else torch.device("cpu")


def _load(loader: Callable | None, spec: Any, model_id: str) -> Any:
    return (loader or load_model)(spec, model_id)


class TrainWorker:
    """One training rank of a model's worker group.

    Args:
        spec: the model's :class:`~drmas_train.model.models.ModelSpec`. model_id: its pool id.
        rank, world_size: this rank and the group size.
        loader: ``(spec, model_id) -> LoadedModel`` (None: :func:`drmas_train.model.models.load_model`); must be
            importable by the worker (a module-level function).
        optim_kwargs: :func:`drmas_train.algorithm.optim.build_optimizer` keyword arguments.
        kl: keep a frozen reference copy (``algorithm.kl_coef > 0`` or ``algorithm.reward_kl_coef > 0``).
        strategy: ``auto`` | ``fsdp2`` | ``ddp`` (:func:`~drmas_train.distributed.data_parallel.resolve_strategy`: ``auto``
            is the plain module on one rank).
        threads: torch CPU threads. use_gpu: train on the bundle's GPU (NCCL) instead of the CPU (gloo).
        critics: ``critic_id -> build_optimizer keyword arguments`` of the critics this model's agents use (PPO
            with a critic); each starts from the model's loaded weights, its head seeded with ``spec.seed``.

    Host memory (``host_memory``, ``distributed.rank_host_memory``): with ``release`` the constructor fixes glibc's
    mmap threshold before the rank allocates anything large (unless the environment sets it:
    ``MALLOC_MMAP_THRESHOLD_`` / ``GLIBC_TUNABLES``), so freed activations go back to the OS instead of staying in the
    heap, and each call that runs forwards (update, log-probs, critic) ends by returning the memory it freed
    (:mod:`drmas_train.distributed.host_memory`); with ``keep`` the rank leaves glibc's defaults and holds what it
    freed, as a single process does (faster on CPU: no page is faulted in afresh; more resident memory).

    Raises:
        ValueError: ``host_memory`` not one of :data:`~drmas_train.distributed.config.RANK_HOST_MEMORY`.
    """

    def __init__(self, spec: Any, model_id: str, rank: int, world_size: int, *, loader: Callable | None = None,
                 optim_kwargs: dict[str, Any] | None = None, kl: bool = False, strategy: str = "auto",
                 threads: int = 1, use_gpu: bool = False, critics: dict[str, dict[str, Any]] | None = None,
                 host_memory: str = "release") -> None:  # fmt: skip
        if host_memory not in RANK_HOST_MEMORY:
            raise ValueError(f"host_memory must be {' or '.join(map(repr, RANK_HOST_MEMORY))}, got {host_memory!r}")
        self.release = host_memory == "release"
        if self.release:
            cap_mmap_threshold()  # before the model and its activations are allocated
        torch.set_num_threads(max(int(threads), 1))
        self.spec, self.model_id, self.rank, self.world_size = spec, model_id, rank, world_size
        self.loader, self.optim_kwargs, self.kl = loader, dict(optim_kwargs or {}), kl
        self.critic_kwargs = dict(critics or {})
        self.device = worker_device(use_gpu)
        self.strategy = resolve_strategy(strategy, self.device.type, world_size)  # auto on one rank: the plain module
        self.model = self.opt = self.ref = self.tokenizer = None
        self.critics: dict[str, tuple[Any, Any]] = {}  # critic_id -> (wrapped ValueModel, ModelOptimizer)

    def _release(self) -> None:
        """Return the memory this call freed to the OS (``host_memory="release"``); nothing with ``keep``."""
        if self.release:
            release_freed_memory()

    def address(self) -> tuple[str, int]:
        """(node ip, port) of the process group's rendezvous, asked of rank 0: it opens the group's TCP store on a
        port the system picks (``TCPStore(port=0)``) and keeps it, so no other process can take the port between
        choosing and binding it."""
        self._store = dist.TCPStore("0.0.0.0", 0, self.world_size, is_master=True, wait_for_workers=False)
        return ray.util.get_node_ip_address(), self._store.port

    def setup(self, master_addr: str, master_port: int) -> str:
        """Join the process group (through rank 0's store), load the model, shard/wrap it, build the optimizer.
        Returns the strategy."""
        store = getattr(self, "_store", None) or dist.TCPStore(master_addr, master_port, self.world_size, is_master=False)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL binds this process to the bundle's GPU
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size)
        loaded = _load(self.loader, self.spec, self.model_id)
        self.tokenizer = loaded.tokenizer
        if self.kl:
            self.ref = frozen_copy(loaded.model).to(self.device)  # in the compute dtype, as the reference's ref
        for critic_id, kwargs in self.critic_kwargs.items():  # from the loaded weights, before the model is wrapped
            critic = wrap_model(ValueModel.from_causal_lm(loaded.model, seed=self.spec.seed), self.strategy, self.device)
            self.critics[critic_id] = (critic, build_optimizer(f"critic/{critic_id}", critic, **kwargs))
        self.model = wrap_model(loaded.model, self.strategy, self.device)
        self.opt = build_optimizer(self.model_id, self.model, **self.optim_kwargs)
        return self.strategy

    def update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, settings: UpdateSettings) -> dict[str, float]:
        """This rank's part of the PPO update, π_old included (:func:`~drmas_train.algorithm.update.update_policy`
        with the rank's :func:`~drmas_train.distributed.data_parallel.rank_hooks`: every rank recomputes the same
        samples, with the update's forward and micro-batches)."""
        start = time.perf_counter()
        pad = self.tokenizer.pad_token_id
        settings = rank_settings(self.model, settings)
        hooks = rank_hooks(self.model, rank=self.rank, world_size=self.world_size, pad_token_id=pad)
        out = update_policy(self.model, self.opt, samples, advantages, settings, pad_token_id=pad, ref_model=self.ref,
                            seed=seed, hooks=hooks)  # fmt: skip
        updated = time.perf_counter()
        del samples
        self._release()  # the update's freed activations and gradients leave the process before the rollout
        # seconds inside the rank (WorkerGroup.finish_update reports the slowest rank's): what the driver's wait adds
        # beyond them is dispatch, the samples' transfer and the result's return
        return {**out, "peak_rss_mb": peak_rss_mb(), "update_s": updated - start,
                "release_s": time.perf_counter() - updated}  # fmt: skip

    def kl_logprobs(self, samples: Sequence[Any], settings: UpdateSettings) -> tuple[list[list[float]], list[list[float]]]:
        """Collective: π_old's (recomputed with the training model when ``settings.recompute_old_logprobs``, on every
        rank as the update does) and the frozen reference's log-probs of every response token, for the KL in the
        reward; the reference's forward runs on rank 0 only (its copy is not sharded), the others return ``[]``."""
        pad = self.tokenizer.pad_token_id
        if settings.recompute_old_logprobs:
            settings = rank_settings(self.model, settings)
            hooks = rank_hooks(self.model, rank=self.rank, world_size=self.world_size, pad_token_id=pad)
            samples, _ = recompute_old_logprobs(hooks.forward, samples, settings, pad_token_id=pad,
                                                agree_budget=hooks.agree_budget)  # fmt: skip
        if self.rank != 0:
            self._release()
            return [], []
        ref, _ = recompute_old_logprobs(self.ref, samples, settings, pad_token_id=pad)
        out = [list(s.old_logprobs) for s in samples], [list(s.old_logprobs) for s in ref]
        del samples, ref
        self._release()
        return out

    def critic_values(self, critic_id: str, samples: Sequence[Any], settings: UpdateSettings) -> list[np.ndarray]:
        """Collective: ``V_t`` of every response token under critic ``critic_id``
        (:func:`~drmas_train.algorithm.critic.critic_values`, every rank the same forwards)."""
        critic, _ = self.critics[critic_id]
        hooks = rank_hooks(critic, rank=self.rank, world_size=self.world_size, pad_token_id=self.tokenizer.pad_token_id)
        out = critic_values(hooks.forward, samples, rank_settings(critic, settings), pad_token_id=self.tokenizer.pad_token_id,
                            agree_budget=hooks.agree_budget)  # fmt: skip
        self._release()
        return out

    def update_critic(self, critic_id: str, samples: Sequence[Any], old_values: np.ndarray, returns: np.ndarray,
                      seed: int, settings: UpdateSettings) -> dict[str, float]:  # fmt: skip
        """This rank's part of critic ``critic_id``'s update (:func:`~drmas_train.algorithm.critic.value_update` with
        the rank's :func:`~drmas_train.distributed.data_parallel.rank_hooks`, as the policy's update)."""
        critic, opt = self.critics[critic_id]
        pad = self.tokenizer.pad_token_id
        hooks = rank_hooks(critic, rank=self.rank, world_size=self.world_size, pad_token_id=pad)
        with opt.resident():
            out = value_update(critic, opt, samples, old_values, returns, rank_settings(critic, settings),
                               pad_token_id=pad, seed=seed, hooks=hooks)  # fmt: skip
        self._release()
        return out

    def save_critic(self, critic_id: str, path: str) -> None:
        """Collective: sharded checkpoint of a critic and its optimizer (as :meth:`save`)."""
        save_sharded(*self.critics[critic_id], path)

    def load_critic(self, critic_id: str, path: str) -> None:
        """Collective: inverse of :meth:`save_critic`."""
        load_sharded(*self.critics[critic_id], path)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the full (unsharded) CPU state dict on rank 0, ``{}`` on the other ranks."""
        state = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return state if self.rank == 0 else {}

    def publish_weights(self) -> list[Any]:
        """Collective: rank 0 puts the full state dict in Ray's object store and returns ``[its ObjectRef]`` (a
        small reply the driver can wait on; the weights never pass through the driver); other ranks ``[]``. Float32
        master weights are cast to the compute dtype first: the engines hold that (:meth:`ModelSpec.engine_spec`), and
        the object store carries half the bytes."""
        state = self.full_state_dict()
        if self.rank != 0:
            return []
        if self.spec.holds_masters():
            dtype = getattr(torch, self.spec.dtype)
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        return [ray.put(state)]

    def save_hf(self, path: str) -> None:
        """Collective: rank 0 writes the current weights as a Hugging Face folder (``save_pretrained`` of the full
        state dict + the tokenizer) at ``path``, the folder ``drmas eval --model`` and ``load_model`` read; the
        other ranks only join the gather. The driver never holds the weights."""
        state = self.full_state_dict()
        if self.rank == 0:
            save_folder(unwrap_ddp(self.model), self.tokenizer, path, state_dict=state)  # a worker's stderr is a log

    def save(self, path: str) -> None:
        """Collective: sharded checkpoint of the model and its :class:`~drmas_train.algorithm.optim.ModelOptimizer` (AdamW state,
        LR schedule, skip counter) under ``path`` (:func:`drmas_train.distributed.checkpoint.save_sharded`, DCP, atomic)."""
        save_sharded(self.model, self.opt, path)

    def load(self, path: str) -> None:
        """Collective: inverse of :meth:`save`."""
        load_sharded(self.model, self.opt, path)

    def pid(self) -> int:
        """The rank's process id (tests kill it)."""
        return os.getpid()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class GenerationWorker:
    """An HF generation engine over a full copy of one model's weights.

    Args:
        spec, model_id, loader: as :class:`TrainWorker` (the initial weights; replaced by every push).
        threads: torch CPU threads. use_gpu: sample on the bundle's GPU.
        backend_kwargs: :class:`~drmas_train.backends.hf.HFBackend` arguments (``max_batch_size``, ...).
    """

    def __init__(self, spec: Any, model_id: str, *, loader: Callable | None = None, threads: int = 1,
                 use_gpu: bool = False, backend_kwargs: dict[str, Any] | None = None) -> None:  # fmt: skip
        torch.set_num_threads(max(int(threads), 1))
        loaded = _load(loader, spec.engine_spec(), model_id)  # in the compute dtype: no master weights here
        loaded.model.to(worker_device(use_gpu))
        self.backend = HFBackend.from_loaded(loaded, **dict(backend_kwargs or {}))
        self.version = -1  # -1: the loader's weights, never pushed (a fresh or restarted worker)

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Copy a full state dict (from the object store) into the engine's model; returns ``version``.

        Raises:
            RuntimeError: keys do not match the model (``load_state_dict(strict=True)``).
        """
        self.backend.model.load_state_dict(state, strict=True)
        self.version = int(version)
        return self.version

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: Any, version: int) -> list[Any]:
        """:meth:`HFBackend.generate_ids` with the weights of ``version``.

        Raises:
            StaleWeightsError: this worker holds another version (the caller pushes weights and re-issues).
        """
        if version != self.version:
            raise StaleWeightsError(f"generation worker holds weights v{self.version}, the call needs v{version}")
        return self.backend.generate_ids(prompt_ids, sampling)
