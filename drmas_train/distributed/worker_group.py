"""One model's worker group: its training ranks (:class:`~drmas_train.distributed.train_ranks.TrainRanks`) and its
generation engines (:class:`~drmas_train.distributed.generation_engines.GenerationEngines`), one of each per bundle
of the resource pool, and the weight versions that tie them.

An update runs on the ranks; :meth:`WorkerGroup.publish` then moves the new weights trainer -> engines in memory (rank
0's full state dict through Ray's shared-memory object store) as the next version. vLLM engines share their bundle's
GPU with the rank beside them, so :meth:`WorkerGroup.start_update` puts them to sleep first and the push after the
update wakes them: sleep -> update -> wake_up + load_weights (on CPU bundles, allowed only with ``vllm_allow_cpu``,
vLLM's CPU build has no sleep mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.distributed.generation_engines import GenerationEngines
from drmas_train.distributed.resource_pool import ResourcePool
from drmas_train.distributed.train_ranks import TrainRanks

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
                 **engines: Any) -> None:  # fmt: skip
        self.model_id, self.world_size = model_id, len(bundles)
        self.engines = GenerationEngines(model_id, spec, pool, bundles, share=share, loader=loader, threads=threads,
                                         **engines)  # fmt: skip
        try:
            self.ranks = TrainRanks(model_id, spec, pool, bundles, share=share, loader=loader, optim_kwargs=optim_kwargs,
                                    kl=kl, strategy=strategy, threads=threads, critics=critics)  # fmt: skip
        except BaseException:
            self.engines.close()
            raise
        self.strategy = self.ranks.strategy
        self.version = -1  # the weights the engines hold; -1: their loader's, never pushed
        self.publish()

    def start_update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, settings: UpdateSettings) -> list[Any]:
        """Put the vLLM engines to sleep, then submit the update to every rank without waiting
        (:meth:`TrainRanks.start_update`)."""
        self.engines.sleep()
        return self.ranks.start_update(samples, advantages, seed, settings)

    def finish_update(self, refs: list[Any], *, publish: bool = True) -> dict[str, float]:
        """Wait for :meth:`start_update`, then :meth:`publish` (unless ``publish=False``: the caller publishes later,
        e.g. after every colocated group's update); returns the metrics (reduced over ranks).

        Raises:
            DistributedError: a training rank died.
        """
        metrics = self.ranks.finish_update(refs)
        if publish:
            self.publish()
        return metrics

    def update(self, samples: Sequence[Any], advantages: np.ndarray, seed: int, settings: UpdateSettings) -> dict[str, float]:
        """PPO update on every rank, then :meth:`publish`. Returns the metrics (reduced over ranks)."""
        return self.finish_update(self.start_update(samples, advantages, seed, settings))

    def kl_logprobs(self, samples: Sequence[Any], settings: UpdateSettings) -> tuple[list[list[float]], list[list[float]]]:
        """π_old's and π_ref's per-token log-probs on the ranks (:meth:`TrainRanks.kl_logprobs`)."""
        return self.ranks.kl_logprobs(samples, settings)

    def critic_values(self, critic_id: str, samples: Sequence[Any], settings: UpdateSettings) -> list[np.ndarray]:
        """``V_t`` of every response token under a critic of these ranks (:meth:`TrainRanks.critic_values`)."""
        return self.ranks.critic_values(critic_id, samples, settings)

    def update_critic(self, critic_id: str, samples: Sequence[Any], old_values: np.ndarray, returns: np.ndarray,
                      seed: int, settings: UpdateSettings) -> dict[str, float]:  # fmt: skip
        """Put the vLLM engines to sleep, then update critic ``critic_id`` on the ranks (the engines wake with the
        next :meth:`publish`)."""
        self.engines.sleep()
        return self.ranks.update_critic(critic_id, samples, old_values, returns, seed, settings)

    def publish(self) -> None:
        """Push the ranks' current weights to every engine (in memory) as the next version."""
        self.push(self.stage())

    def stage(self) -> Any:
        """The ranks' current weights gathered into Ray's object store (an ObjectRef; the engines keep theirs):
        the first half of a push whose second half, :meth:`push`, may come later (``run.overlap`` on Ray)."""
        return self.ranks.gather_weights()

    def push(self, weights_ref: Any) -> None:
        """Give every engine ``weights_ref`` (:meth:`stage`'s) as the next version."""
        self.version += 1
        self.engines.push(weights_ref, self.version)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], sampling: Any) -> list[Any]:
        """:meth:`GenerationEngines.generate_ids` (faults re-issued and counted there)."""
        return self.engines.generate_ids(prompt_ids, sampling)

    def full_state_dict(self) -> dict[str, Any]:
        """The current full weights (those the engines hold)."""
        return ray.get(self.engines.weights_ref)

    def save(self, path: str | Path) -> None:
        """Sharded checkpoint (model + optimizer) of every rank under ``path``."""
        self.ranks.save(path)

    def save_hf(self, path: str | Path) -> None:
        """The current weights as a Hugging Face folder at ``path``, written by rank 0."""
        self.ranks.save_hf(path)

    def load(self, path: str | Path) -> None:
        """Inverse of :meth:`save`, then :meth:`publish`."""
        self.ranks.load(path)
        self.publish()

    def save_critics(self, folder: str | Path) -> None:
        """The critics' sharded checkpoints under ``folder/<critic_id>/sharded`` (:meth:`TrainRanks.save_critics`)."""
        self.ranks.save_critics(folder)

    def load_critics(self, folder: str | Path) -> None:
        """Inverse of :meth:`save_critics`."""
        self.ranks.load_critics(folder)

    def close(self) -> None:
        """Kill the group's actors (idempotent)."""
        self.ranks.close()
        self.engines.close()
