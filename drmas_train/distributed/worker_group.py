"""One model's worker group: its training ranks (``N`` :class:`~drmas_train.distributed.workers.TrainWorker` actors
that form one ``torch.distributed`` process group) and its generation engines
(:class:`~drmas_train.distributed.generation_engines.GenerationEngines`), one of each per bundle of the resource
pool, and the weight versions that tie them.

Jobs: start the ranks, run the PPO update (and the critics', the KL log-probs, the values) on every rank (the same
samples through one object-store copy), move the new weights trainer -> engines in memory (:meth:`WorkerGroup.publish`:
rank 0's full state dict through Ray's shared-memory object store) as the next version, and save / load sharded
checkpoints. vLLM engines share their bundle's GPU with the rank beside them, so :meth:`WorkerGroup.start_update`
puts them to sleep first and the push after the update wakes them: sleep -> update -> wake_up + load_weights (on CPU
bundles, allowed only with ``vllm_allow_cpu``, vLLM's CPU build has no sleep mode).

Ray never restarts a training rank: one that dies ends the call with a
:class:`~drmas_train.distributed.errors.DistributedError` naming the model, and the updater
(:meth:`~drmas_train.distributed.updater.RayUpdater.recover`) rebuilds the group from a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.distributed.errors import DistributedError
from drmas_train.distributed.generation_engines import GenerationEngines
from drmas_train.distributed.resource_pool import ResourcePool
from drmas_train.distributed.workers import TrainWorker

__all__ = ["WorkerGroup"]


class WorkerGroup:
    """Training ranks + generation engines of one model on ``bundles`` of ``pool``.

    Args:
        model_id: the pool's model id. spec: its :class:`~drmas_train.model.models.ModelSpec`.
        pool: the resource pool. bundles: bundle index of each rank (``len(bundles)`` = world size).
        share: actors living on each bundle (2 per colocated group): each asks Ray for ``1/share`` of it.
        loader: ``(spec, model_id) -> LoadedModel`` importable by the workers (None: ``load_model``).
        optim_kwargs: :func:`~drmas_train.algorithm.optim.build_optimizer` arguments. kl: keep a frozen reference.
        strategy: ``auto`` | ``fsdp2`` | ``ddp``. threads: torch threads per worker.
        host_memory: the ranks' ``release`` | ``keep`` (``distributed.rank_host_memory``, :class:`TrainWorker`).
        critics: ``critic_id -> optimizer arguments`` of the PPO critics on the training ranks (None: none).
        engines: keyword arguments of :class:`GenerationEngines` (``engine``, ``engine_kwargs``, ``sleep_level``,
            ``max_restarts``, ``backend_kwargs``, ``vllm_allow_cpu``, ``vllm_python``).

    Raises:
        ValueError: an unknown engine, or ``vllm`` on a pool without GPUs and without ``vllm_allow_cpu``.
        DistributedError: a rank failed to start (its error chained).
    """

    def __init__(self, model_id: str, spec: Any, pool: ResourcePool, bundles: Sequence[int], *, share: int = 2,
                 loader: Callable | None = None, optim_kwargs: dict[str, Any] | None = None, kl: bool = False,
                 strategy: str = "auto", threads: int = 1, critics: dict[str, dict[str, Any]] | None = None,
                 host_memory: str = "release", **engines: Any) -> None:  # fmt: skip
        self.model_id, self.world_size = model_id, len(bundles)
        self.critic_ids = list(critics or {})
        self.actors: list[Any] = []  # the training ranks, rank order
        self.engines = GenerationEngines(model_id, spec, pool, bundles, share=share, loader=loader, threads=threads,
                                         **engines)  # fmt: skip
        try:
            actor = ray.remote(TrainWorker)
            self.actors = [
                actor.options(max_restarts=0, **pool.actor_options(b, share)).remote(
                    spec, model_id, rank, self.world_size, loader=loader, optim_kwargs=optim_kwargs, kl=kl,
                    strategy=strategy, threads=threads, use_gpu=pool.gpus > 0, critics=critics,
                    host_memory=host_memory)
                for rank, b in enumerate(bundles)
            ]  # fmt: skip
            try:
                addr, port = ray.get(self.actors[0].address.remote())
                self.strategy: str = ray.get([t.setup.remote(addr, port) for t in self.actors])[0]
            except Exception as err:
                raise DistributedError(f"worker group {model_id!r} ({self.world_size} ranks) failed to start: "
                                       f"{err}") from err  # fmt: skip
        except BaseException:
            self.close()
            raise
        self.version = -1  # the weights the engines hold; -1: their loader's, never pushed
        self.publish()

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """``ray.get`` of the ranks' ``refs``; a dead rank raises :class:`DistributedError` naming ``what``."""
        try:
            return ray.get(refs)
        except RayActorError as err:
            raise DistributedError(
                f"a training rank of model {self.model_id!r} died during {what}; the step is lost. Resume from the "
                f"latest complete checkpoint with `drmas train --resume` (cause: {err})") from err  # fmt: skip

    def start_update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, settings: UpdateSettings) -> list[Any]:
        """Put the vLLM engines to sleep, then submit the update to every rank without waiting (groups on disjoint
        bundles then train at once); the ranks first recompute π_old when ``settings.recompute_old_logprobs``.
        Returns the ranks' refs (:meth:`finish_update`)."""
        self.engines.sleep()
        # one object-store copy for all ranks; Ray resolves top-level ObjectRef arguments on the worker
        samples_ref, adv_ref = ray.put(list(samples)), ray.put(np.asarray(advantages))
        return [t.update.remote(samples_ref, adv_ref, seed, settings) for t in self.actors]

    def finish_update(self, refs: list[Any], *, publish: bool = True) -> dict[str, float]:
        """Wait for :meth:`start_update`'s ranks, then :meth:`publish` (unless ``publish=False``: the caller publishes
        later, e.g. after every colocated group's update). Returns rank 0's metrics (reduced over ranks, identical on
        each), ``rank_peak_rss_mb``, the largest peak resident memory of any rank so far (MiB), and the slowest rank's
        seconds in its update (``rank_update_s``: π_old and the PPO steps) and in releasing its freed memory after it
        (``rank_release_s``).

        Raises:
            DistributedError: a training rank died.
        """
        outs = self._get(refs, "the update")
        peak = max(float(o.pop("peak_rss_mb", 0.0)) for o in outs)
        timing = {f"rank_{k}": max(float(o.pop(k, 0.0)) for o in outs) for k in ("update_s", "release_s")}
        if publish:
            self.publish()
        return {**outs[0], "rank_peak_rss_mb": peak, **timing}

    def update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, settings: UpdateSettings) -> dict[str, float]:
        """PPO update on every rank, then :meth:`publish`. Returns the metrics (reduced over ranks)."""
        return self.finish_update(self.start_update(samples, advantages, seed, settings))

    def kl_logprobs(self, samples: Sequence[Any], settings: UpdateSettings) -> tuple[list[list[float]], list[list[float]]]:
        """π_old's and π_ref's log-probs of every response token (:meth:`TrainWorker.kl_logprobs`, rank 0's)."""
        ref = ray.put(list(samples))
        return self._get([t.kl_logprobs.remote(ref, settings) for t in self.actors], "the KL log-probs")[0]

    def critic_values(self, critic_id: str, samples: Sequence[Any], settings: UpdateSettings) -> list[np.ndarray]:
        """``V_t`` of every response token under critic ``critic_id`` (rank 0's; every rank computes the same)."""
        ref = ray.put(list(samples))
        return self._get([t.critic_values.remote(critic_id, ref, settings) for t in self.actors], "the critic values")[0]

    def update_critic(self, critic_id: str, samples: Sequence[Any], old_values: np.ndarray, returns: np.ndarray,
                      seed: int, settings: UpdateSettings) -> dict[str, float]:  # fmt: skip
        """Put the vLLM engines to sleep, then update critic ``critic_id`` on every rank (the engines wake with the
        next :meth:`publish`); rank 0's metrics (reduced over ranks, identical on each).

        Raises:
            DistributedError: a training rank died.
        """
        self.engines.sleep()
        refs = [ray.put(x) for x in (list(samples), np.asarray(old_values), np.asarray(returns))]
        return self._get([t.update_critic.remote(critic_id, *refs, seed, settings) for t in self.actors],
                         "the critic update")[0]  # fmt: skip

    def publish(self) -> None:
        """Push the ranks' current weights to every engine (in memory) as the next version."""
        self.push(self.stage())

    def stage(self) -> Any:
        """The ranks' current weights gathered into Ray's object store (rank 0's full state dict; an ObjectRef: the
        driver never copies the weights, and the engines keep theirs): the first half of a push whose second half,
        :meth:`push`, may come later (``run.overlap`` on Ray)."""
        return self._get([t.publish_weights.remote() for t in self.actors], "the weight gather")[0][0]

    def push(self, weights_ref: Any) -> None:
        """Give every engine ``weights_ref`` (:meth:`stage`'s) as the next version."""
        self.version += 1
        self.engines.push(weights_ref, self.version)

    def full_state_dict(self) -> dict[str, Any]:
        """The current full weights (those the engines hold)."""
        return ray.get(self.engines.weights_ref)

    def save(self, path: str | Path) -> None:
        """Sharded checkpoint (model + optimizer, ``torch.distributed.checkpoint``) of every rank under ``path``."""
        self._get([t.save.remote(str(path)) for t in self.actors], "the checkpoint save")

    def save_hf(self, path: str | Path) -> None:
        """The current weights as a Hugging Face folder at ``path``, written by rank 0 (``TrainWorker.save_hf``)."""
        self._get([t.save_hf.remote(str(path)) for t in self.actors], "the Hugging Face export")

    def load(self, path: str | Path) -> None:
        """Inverse of :meth:`save`, then :meth:`publish`."""
        self._get([t.load.remote(str(path)) for t in self.actors], "the checkpoint load")
        self.publish()

    def save_critics(self, folder: str | Path) -> None:
        """Sharded checkpoint of every critic of these ranks under ``folder/<critic_id>/sharded``."""
        for cid in self.critic_ids:
            self._get([t.save_critic.remote(cid, str(Path(folder) / cid / "sharded")) for t in self.actors],
                      "the critic checkpoint save")  # fmt: skip

    def load_critics(self, folder: str | Path) -> None:
        """Inverse of :meth:`save_critics`.

        Raises:
            FileNotFoundError: a critic's checkpoint is missing.
        """
        for cid in self.critic_ids:
            path = Path(folder) / cid / "sharded"
            if not path.is_dir():
                raise FileNotFoundError(f"checkpoint has no critic {cid!r} ({path}): it was written by a run without it")
            self._get([t.load_critic.remote(cid, str(path)) for t in self.actors], "the critic checkpoint load")

    def rank_pids(self) -> list[int]:
        """Process ids of the training ranks (fault-injection tests kill them)."""
        return ray.get([t.pid.remote() for t in self.actors])

    def close(self) -> None:
        """Kill the group's actors (idempotent)."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        self.engines.close()
