"""``RayUpdater``: the trainer's ``Updater`` protocol (``drmas_train.run.updater``) over Ray worker groups.

:meth:`RayUpdater.build` starts or joins Ray (:func:`~drmas_train.distributed.cluster.init_ray`), sizes one
:class:`~drmas_train.distributed.resource_pool.ResourcePool`, starts one
:class:`~drmas_train.distributed.worker_group.WorkerGroup` per trainable model (a model shared by several agents
is one group; non-sharing and heterogeneous models one group each) and puts a
:class:`~drmas_train.distributed.backend.RayBackend` in ``pool.backends[model_id]``. Frozen models keep their
in-process backend.

The driver holds no weights of a trainable model: once its worker group has started, the pool entry's model is
moved to the ``meta`` device (:func:`release_driver_weights`; its config, tokenizer and spec stay). Generation
and training run in the workers, the weights move rank 0 -> object store -> generation workers, and the Hugging
Face export of a checkpoint is written by rank 0. The driver loads each trainable model once at start-up (the
pool is built before the groups) and frees it before the first rollout.

Its part of a checkpoint (the run writes the atomic directory, ``drmas_train.run.checkpoint``)::

    models/<model_id>/      HF format (save_pretrained), written by rank 0 from the gathered full state dict:
                            drmas eval --model loads it
    sharded/<model_id>/     torch.distributed.checkpoint of every rank's model + optimizer shard, and the
                            LR schedule (what --resume restores)
    critics/<critic_id>/sharded/   the same for each PPO critic (``algorithm.estimator: gae``)
    trainer_state.pt, config.yaml   (the run's own part)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray

from drmas_train.algorithm.agent_grads import namespaced
from drmas_train.algorithm.config import CriticConfig, OptimConfig
from drmas_train.algorithm.critic import critic_models, critic_of
from drmas_train.algorithm.gae import pad_rows
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.distributed.backend import RayBackend
from drmas_train.distributed.cluster import init_ray
from drmas_train.distributed.config import DistributedConfig
from drmas_train.distributed.errors import DistributedError
from drmas_train.distributed.resource_pool import ResourcePool, plan_world_sizes
from drmas_train.distributed.worker_group import WorkerGroup
from drmas_train.errors import ConfigError

__all__ = ["RayUpdater", "check_context", "vllm_engine_kwargs", "release_driver_weights", "driver_parameter_count"]


def check_context(max_model_len: int, configs: dict[str, Any]) -> None:
    """Refuse, before any engine starts, a vLLM ``max_model_len`` longer than a model's context.

    vLLM rejects ``max_model_len`` > ``max_position_embeddings`` when the engine is built (a pydantic error inside a
    Ray actor's creation, raised again on each of its restarts); this says it once, in the driver.

    Args:
        max_model_len: the engines' ``max_model_len`` (tokens). configs: ``model_id -> transformers config``.

    Raises:
        ConfigError: names the model, both lengths and the settings that set them.
    """
    for mid, config in configs.items():
        context = getattr(config, "max_position_embeddings", None)
        if isinstance(context, int) and max_model_len > context:
            raise ConfigError(
                f"model {mid!r}: vLLM's max_model_len {max_model_len} (rollout.max_prompt_tokens + "
                f"rollout.max_new_tokens, or distributed.vllm_kwargs.max_model_len) exceeds the model's context of "
                f"{context} tokens (max_position_embeddings); lower rollout.max_prompt_tokens"
            )


def vllm_engine_kwargs(dist: DistributedConfig, n_models: int, *, seed: int, max_model_len: int) -> dict[str, Any]:
    """``vllm.LLM`` arguments of every vLLM generation engine of a run with ``n_models`` trainable models.

    ``gpu_memory_utilization``: ``distributed.vllm_gpu_memory_utilization`` split evenly between the colocated
    models' engines (all of them are awake on each GPU during the rollout); ``seed``: the run's seed;
    ``max_model_len``: ``rollout.max_prompt_tokens + rollout.max_new_tokens`` (verl's default,
    ``langfengQ/DrMAS verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py:126``); then ``distributed.vllm_kwargs``
    (which override these).
    """
    per_gpu = n_models if dist.colocate else 1
    return {"gpu_memory_utilization": dist.vllm_gpu_memory_utilization / per_gpu, "seed": seed,
            "max_model_len": max_model_len, **dist.vllm_kwargs}  # fmt: skip


def release_driver_weights(loaded: Any) -> None:
    """Free the driver's copy of a model that trains and samples in a worker group: its parameters and buffers
    move to the ``meta`` device (shapes, dtypes, config, tokenizer and spec stay; no memory is held).

    Raises:
        RuntimeError: the model is used afterwards for anything that reads values (a meta tensor has none).
    """
    loaded.model.to("meta")


def driver_parameter_count(pool: Any, model_ids: list[str]) -> int:
    """Parameters and buffers of ``model_ids`` that hold memory in this process (0 on the Ray path)."""
    total = 0
    for mid in model_ids:
        model = pool.models[mid].model
        total += sum(t.numel() for t in [*model.parameters(), *model.buffers()] if not t.is_meta)
    return total


class RayUpdater:
    """PPO updates on Ray worker groups (``distributed.enabled: true``): the ``Updater`` protocol of
    ``drmas_train.run.updater``, as the single-process ``LocalUpdater``, plus its ``PacedUpdater`` capability
    (:meth:`start_model`, :meth:`ready`, :meth:`finish_model`: per-model pacing).

    Args:
        settings: the run's update settings. dist: the ``distributed`` section. pool: the driver's
        :class:`~drmas_train.model.assignment.ModelPool` (trainable models on the ``meta`` device: tokenizer and
        config only). groups: ``model_id -> WorkerGroup``. resources: the pool. owns_ray: shut Ray down in
        :meth:`close` (it was started here). critic_keys: ``agent_id -> critic_id`` of PPO's critics, which live
        on the training ranks of their agent's model (none by default).
    """

    def __init__(self, settings: UpdateSettings, dist: DistributedConfig, pool: Any, groups: dict[str, WorkerGroup],
                 resources: ResourcePool | None, *, owns_ray: bool = False,
                 group_args: dict[str, tuple[tuple, dict]] | None = None,
                 critic_keys: dict[str, str] | None = None) -> None:  # fmt: skip
        self.settings, self.dist, self.pool, self.groups, self.resources = settings, dist, pool, groups, resources
        self.critic_keys = dict(critic_keys or {})
        #: critic_id -> the model whose ranks hold it
        self.critic_groups = critic_models(self.critic_keys, {a: pool.model_of(a) for a in self.critic_keys})
        self.owns_ray = owns_ray
        self.group_args = dict(group_args or {})  # model_id -> WorkerGroup (args, kwargs), to rebuild a group
        self.training_restarts = 0  # training groups rebuilt from a checkpoint (at most distributed.max_restarts)
        self._failed: str | None = None  # model whose training rank died in the last update
        self._reissued = {mid: 0 for mid in groups}  # calls re-issued after engine faults, as of the last update
        #: leave the weight pushes to the caller (:meth:`update` pushes nothing): the asynchronous loop's generation
        #: side with ``run.overlap`` stages each update's weights and pushes them between two of its batches
        #: (:class:`~drmas_train.run.async_generation.EngineSide`); HF engines only (vLLM's sleep around an update
        #: would take the engines from the generation thread)
        self.defer_pushes = False

    @classmethod
    def build(cls, settings: UpdateSettings, dist: DistributedConfig, optim: OptimConfig, pool: Any,
              model_ids: list[str], *, seed: int, max_model_len: int, loader: Any = None,
              backend_kwargs: dict[str, Any] | None = None, keep_reference: bool = False,
              critic: CriticConfig | None = None, critic_keys: dict[str, str] | None = None) -> RayUpdater:  # fmt: skip
        """Start the worker groups of ``model_ids`` and route their generation through them.

        Args:
            settings: the run's update settings. dist: the ``distributed`` section. optim: the ``optim`` section
                (AdamW of every rank; per-model ``lr`` / ``weight_decay`` overrides come from each model's spec).
            pool: the driver's model pool. model_ids: the trainable models. seed: the run's seed.
            max_model_len: prompt + response token limit of one call (vLLM engines).
            loader, backend_kwargs: passed to the workers (tests inject tiny models).
            keep_reference: keep a frozen reference on the ranks even without a KL loss (the KL in the reward).
            critic: the ``critic`` section when the run has critics (PPO with a critic), else None.
            critic_keys: ``agent_id -> critic_id`` (:func:`drmas_train.algorithm.critic.critic_keys`).

        Raises:
            ConfigError: the cluster cannot hold the requested world sizes, or a vLLM engine's ``max_model_len``
                exceeds its model's context (:func:`check_context`).
            DistributedError: a group failed to start.
        """
        d = dist
        vllm_kwargs = None
        if d.generation_engine == "vllm":
            vllm_kwargs = vllm_engine_kwargs(d, len(model_ids), seed=seed, max_model_len=max_model_len)
            check_context(vllm_kwargs["max_model_len"], {mid: pool.models[mid].model.config for mid in model_ids})
        owns = not ray.is_initialized()
        resources = init_ray(d.address, dashboard=d.dashboard)
        if d.devices_per_node > 0:
            available = d.num_nodes * d.devices_per_node
            if resources.get("GPU", 0) < available:
                if owns:
                    ray.shutdown()
                raise ConfigError(f"distributed.devices_per_node={d.devices_per_node} x num_nodes={d.num_nodes} GPUs "
                                  f"requested, the Ray cluster has {resources.get('GPU', 0):g}")  # fmt: skip
        else:
            available = int(resources.get("CPU", 0) // d.cpus_per_worker)
        try:
            sizes, need = plan_world_sizes(model_ids, dict(d.world_size), available, colocate=d.colocate)
        except ValueError as err:
            if owns:
                ray.shutdown()
            raise ConfigError(f"distributed: {err}") from None
        rpool = ResourcePool(need, cpus_per_bundle=d.cpus_per_worker, gpus_per_bundle=1 if d.devices_per_node else 0)
        share = 2 * len(model_ids) if d.colocate else 2
        groups: dict[str, WorkerGroup] = {}
        group_args: dict[str, tuple[tuple, dict]] = {}
        keys = dict(critic_keys or {}) if critic is not None else {}
        homes = critic_models(keys, {a: pool.model_of(a) for a in keys})  # critic_id -> model_id
        critic_optim = {} if critic is None else critic.optimizer_kwargs(betas=optim.betas, offload=optim.offload)
        try:
            for mid in model_ids:
                spec = pool.models[mid].spec
                optim_kwargs = optim.optimizer_kwargs(spec.optimizer)
                group_args[mid] = ((mid, spec, rpool, rpool.take(sizes[mid], colocate=d.colocate)), dict(
                    share=share, loader=loader, optim_kwargs=optim_kwargs, kl=bool(settings.loss.kl_coef) or keep_reference,
                    strategy=d.strategy, threads=d.cpus_per_worker, host_memory=d.rank_host_memory,
                    max_restarts=d.max_restarts, backend_kwargs=backend_kwargs,
                    engine=d.generation_engine, engine_kwargs=vllm_kwargs, sleep_level=d.vllm_sleep_level,
                    vllm_allow_cpu=d.vllm_allow_cpu, vllm_python=d.vllm_python,
                    critics={cid: critic_optim for cid, home in homes.items() if home == mid},
                ))  # fmt: skip
                groups[mid] = WorkerGroup(*group_args[mid][0], **group_args[mid][1])
                pool.backends[mid] = RayBackend(groups[mid], pool.models[mid].tokenizer,
                                                chat_template_kwargs=spec.chat_template_kwargs)  # fmt: skip
                release_driver_weights(pool.models[mid])  # the group holds them now
        except BaseException:
            cls(settings, d, pool, groups, rpool, owns_ray=owns).close()
            raise
        return cls(settings, d, pool, groups, rpool, owns_ray=owns, group_args=group_args, critic_keys=keys)

    @property
    def model_ids(self) -> list[str]:
        """Trainable model ids."""
        return list(self.groups)

    def world_size(self, model_id: str) -> int:
        """Training ranks of ``model_id``'s worker group."""
        return self.groups[model_id].world_size

    def start_iteration(self, iteration: int) -> None:
        """Name the iteration in fault messages of the generation engines."""
        for group in self.groups.values():
            group.engines.context = f"iteration {iteration}"

    def update(self, samples: list[Any], adv: np.ndarray, seed: int) -> dict[str, float]:
        """One PPO update per worker group on its model's samples. Colocated groups take turns; groups on
        disjoint bundles (``colocate: false``) train at the same time.

        Colocated vLLM engines (``distributed.generation_engine: vllm``): every group's engines sleep before the
        first rank trains and are woken by the weight pushes after the last update, so no engine holds GPU memory
        while any model trains on the shared GPUs (sleep -> updates -> wake_up + load_weights). With
        :attr:`defer_pushes` nothing sleeps and nothing is pushed (HF engines only); the groups train as without it
        (one after the other on shared bundles, at the same time on bundles of their own).

        Returns:
            ``loss/<model_id>/<metric>``, as the single-process updater's, plus per model
            ``dist/<model_id>/generation_restarts`` (engine faults so far in the run),
            ``dist/<model_id>/reissued_calls`` (calls re-issued after faults since the last update) and
            ``dist/<model_id>/rank_peak_rss_mb`` (the largest peak resident memory of its training ranks, MiB),
            ``dist/<model_id>/rank_update_s`` and ``dist/<model_id>/rank_release_s`` (the slowest rank's seconds in
            its update and in releasing its freed memory after it: the rest of ``perf/update_s`` is the driver's
            dispatch, the samples' transfer and the weight push).

        Raises:
            DistributedError: a training rank died (see :meth:`recover`).
        """
        metrics, pending = {}, {}
        colocate = self.dist.colocate
        push = not self.defer_pushes  # else the asynchronous loop's generation side stages and pushes (run.overlap)
        if colocate and push:  # shared GPUs: every engine releases its memory before any group trains
            for group in self.groups.values():
                group.engines.sleep()
        for model_id, group in self.groups.items():
            idx = [i for i, s in enumerate(samples) if s.model_id == model_id]
            pending[model_id] = group.start_update([samples[i] for i in idx], adv[idx], seed, self.settings)
            if colocate:  # shared bundles: one group at a time; weights pushed once all groups trained
                metrics.update(self._finish(model_id, pending.pop(model_id), publish=False))
        for model_id, refs in pending.items():  # groups on bundles of their own train at the same time
            metrics.update(self._finish(model_id, refs, publish=push))
        if colocate and push:
            for model_id in self.groups:
                self._finish(model_id, None)
        return {**metrics, **self._fault_metrics()}

    # -- per-model pacing (run.pacing: per_model): one model's update at a time, polled ------------------------------
    def start_model(self, model_id: str, samples: list[Any], adv: np.ndarray, seed: int) -> list[Any]:
        """Submit the update of ``model_id`` on ``samples`` (its own, ``adv`` row-aligned) to its ranks without
        waiting: the ranks' refs, for :meth:`ready` and :meth:`finish_model`. ``distributed.colocate: false``
        only (groups on bundles of their own; the config refuses per-model pacing otherwise).

        Raises:
            DistributedError: a training rank is gone.
        """
        with self._on_ranks(model_id) as group:
            return group.start_update(samples, adv, seed, self.settings)

    @staticmethod
    def ready(pending: list[list[Any]], *, block: bool) -> list[bool]:
        """Which :meth:`start_model` calls of ``pending`` are finished on all of their ranks; with ``block``, after
        waiting until at least one is (at once when ``pending`` is empty)."""

        def finished(refs: list[Any]) -> bool:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            return len(ready) == len(refs)

        left = [r for refs in pending for r in refs]
        while block and pending and not any(finished(refs) for refs in pending):
            _, left = ray.wait(left, num_returns=1)  # one more rank done (a done one returns at once)
        return [finished(refs) for refs in pending]

    def finish_model(self, model_id: str, refs: list[Any]) -> dict[str, float]:
        """Wait for a :meth:`start_model` and push its weights to the model's engines (unless :attr:`defer_pushes`).

        Returns:
            as :meth:`update`, for this model (its ``loss/<model_id>/...``, ``dist/<model_id>/...``).

        Raises:
            DistributedError: a training rank died (see :meth:`recover`).
        """
        metrics = self._finish(model_id, refs, publish=not self.defer_pushes)
        return {**metrics, **self._fault_metrics([model_id])}

    def _fault_metrics(self, model_ids: list[str] | None = None) -> dict[str, float]:
        """Per model (of ``model_ids``, default all), the faults of its engines: ``dist/<m>/generation_restarts`` (so
        far in the run) and ``dist/<m>/reissued_calls`` (since the last call for it)."""
        metrics = {}
        for model_id in model_ids or list(self.groups):
            engines = self.groups[model_id].engines
            metrics[f"dist/{model_id}/generation_restarts"] = float(engines.restarts)
            metrics[f"dist/{model_id}/reissued_calls"] = float(engines.reissued_calls - self._reissued.get(model_id, 0))
            self._reissued[model_id] = engines.reissued_calls
        return metrics

    def critic_values(self, samples: list[Any]) -> list[np.ndarray]:
        """``V_t`` of every response token of every sample under its agent's critic, computed on the ranks of the
        critic's model (an empty array for an agent without a critic); as ``LocalUpdater.critic_values``.

        Raises:
            DistributedError: a training rank died.
        """
        out = [np.zeros(0)] * len(samples)
        for critic_id, idx in critic_of(self.critic_keys, samples).items():
            with self._on_ranks(self.critic_groups[critic_id]) as group:
                values = group.critic_values(critic_id, [samples[i] for i in idx], self.settings)
            for i, v in zip(idx, values, strict=True):
                out[i] = v
        return out

    def kl_logprobs(self, samples: list[Any]) -> tuple[list[list[float]], list[list[float]]]:
        """π_old's and π_ref's log-probs of every response token, computed on each model's ranks (frozen models:
        the samples' own for both); as ``LocalUpdater.kl_logprobs``.

        Raises:
            DistributedError: a training rank died.
        """
        logprobs = [list(s.old_logprobs) for s in samples]
        ref = [list(s.old_logprobs) for s in samples]
        for model_id in self.groups:
            idx = [i for i, s in enumerate(samples) if s.model_id == model_id]
            if idx:
                with self._on_ranks(model_id) as group:
                    lp, rp = group.kl_logprobs([samples[i] for i in idx], self.settings)
                for i, a, b in zip(idx, lp, rp, strict=True):
                    logprobs[i], ref[i] = a, b
        return logprobs, ref

    def update_critics(self, samples: list[Any], old_values: list[np.ndarray], returns: list[np.ndarray],
                       seed: int) -> dict[str, float]:  # fmt: skip
        """One update of every critic on the ranks of its model, after every vLLM engine went to sleep (they wake
        with the weight push after the policy update, or :meth:`resume_generation`); as
        ``LocalUpdater.update_critics``.

        Raises:
            DistributedError: a training rank died.
        """
        for group in self.groups.values():  # shared GPUs: no engine holds memory while a critic trains
            group.engines.sleep()
        metrics = {}
        for critic_id, idx in critic_of(self.critic_keys, samples).items():
            old, _ = pad_rows([old_values[i] for i in idx])
            ret, _ = pad_rows([returns[i] for i in idx], old.shape[1])
            with self._on_ranks(self.critic_groups[critic_id]) as group:
                out = group.update_critic(critic_id, [samples[i] for i in idx], old, ret, seed, self.settings)
            metrics.update({f"critic/{critic_id}/{k}": v for k, v in out.items()})
        return metrics

    def resume_generation(self) -> None:
        """After an iteration without a policy update (the critic's warm-up): wake the vLLM engines that
        :meth:`update_critics` put to sleep by pushing them the unchanged weights (HF engines never sleep)."""
        if self.dist.generation_engine == "vllm":
            for group in self.groups.values():
                group.publish()

    @contextlib.contextmanager
    def _on_ranks(self, model_id: str) -> Iterator[WorkerGroup]:
        """The group of ``model_id``; remembered as the failed one (for :meth:`recover`) if its ranks die inside."""
        try:
            yield self.groups[model_id]
        except DistributedError:
            self._failed = model_id
            raise

    def _finish(self, model_id: str, refs: list[Any] | None, *, publish: bool = True) -> dict[str, float]:
        """Wait for a group's update (``refs``; None: none) and push its weights (``publish``, always with None)."""
        group = self.groups[model_id]
        try:
            out = group.finish_update(refs, publish=publish) if refs is not None else {}
            if refs is None:
                group.publish()
        except DistributedError:
            self._failed = model_id
            raise
        ranks = {k: out.pop(k) for k in ("rank_peak_rss_mb", "rank_update_s", "rank_release_s") if k in out}
        return {**namespaced(model_id, out), **{f"dist/{model_id}/{k}": v for k, v in ranks.items()}}

    def write_state(self, folder: Path) -> None:
        """Every rank's sharded model + optimizer (``sharded/<model_id>/``) and the HF weights written by rank 0
        (``models/<model_id>/``) into a checkpoint folder."""
        for mid, group in self.groups.items():
            group.save(Path(folder) / "sharded" / mid)
            group.save_hf(Path(folder) / "models" / mid)
            group.save_critics(Path(folder) / "critics")

    def read_state(self, folder: Path) -> None:
        """Restore every group from ``folder/sharded/<model_id>`` and push the weights to its engines.

        Raises:
            FileNotFoundError: the checkpoint has no sharded state for a model (not written by a distributed run).
        """
        folder = Path(folder)
        for mid in self.groups:
            if not (folder / "sharded" / mid).is_dir():
                raise FileNotFoundError(f"checkpoint {folder} has no sharded/{mid}/: it was not written with "
                                        "distributed.enabled=true; resume it without distributed")  # fmt: skip
        for mid, group in self.groups.items():
            group.load(folder / "sharded" / mid)
            group.load_critics(folder / "critics")

    def recover(self, err: DistributedError, checkpoint: Path | None) -> None:
        """After a training rank died in :meth:`update`: rebuild that model's group on its bundles and restore every
        group from ``checkpoint`` (the run's latest complete one); the trainer then rewinds to it.

        Raises:
            DistributedError: ``err`` again, saying where to resume from, when there is no checkpoint yet, no training
                rank failed, or ``distributed.max_restarts`` groups were already rebuilt in this run.
        """
        if self._failed is None or checkpoint is None or self.training_restarts >= self.dist.max_restarts:
            where = (f"the latest complete checkpoint is {checkpoint}" if checkpoint is not None else
                     "no checkpoint was written yet (set run.save_every to checkpoint more often)")  # fmt: skip
            raise DistributedError(f"{err}; {where}") from err
        mid, self._failed = self._failed, None
        self.training_restarts += 1
        self.groups[mid].close()
        args, kwargs = self.group_args[mid]
        self.groups[mid] = WorkerGroup(*args, **kwargs)
        self.pool.backends[mid].group = self.groups[mid]
        self.read_state(checkpoint)

    def close(self) -> None:
        """Stop the worker groups, free the pool, and stop Ray if this updater started it."""
        for group in self.groups.values():
            group.close()
        self.groups = {}
        if self.resources is not None:
            self.resources.shutdown()
            self.resources = None
        if self.owns_ray and ray.is_initialized():
            ray.shutdown()
