"""The generation side of the asynchronous loop (``run.mode: async``): its own copy of each trained model's
weights, the version of each copy, episodes put into the group buffer, weight pushes from the trainer.

In the synchronous loop the rollout engine samples from the very modules the trainer updates. In the asynchronous
loop the generation side holds a **snapshot** of every trained model (a ``copy.deepcopy`` of its module, made once)
and plays episodes with it, so that a batch may be generated with weights older than the trainer's. Each sample is
stamped with the version of the snapshot that generated it (``Sample.policy_version``,
:mod:`drmas_train.run.policy_versions`), and each finished episode is ``put`` into the
:class:`~drmas_train.collect.group_buffer.GroupBuffer`, from which the trainers take whole prompt groups. When the
trainer publishes a new version of a model, :meth:`GenerationSide.publish` copies its weights into the snapshot
(``load_state_dict``: the "weight push"), on that model's own schedule (``push_every``: every update by default).

Frozen models are not copied: their weights never change. LoRA adapters on one shared base share one snapshot of
the base, as they share the trainer's module; a push of any of them pushes the module, so all of its adapters.

The rollout itself is :func:`drmas_train.collect.rollout.rollout`, unchanged, over a
:class:`~drmas_train.model.assignment.ModelPool` of the snapshots with backends built as the trainer's are.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from drmas_train.collect.group_buffer import GroupBuffer
from drmas_train.model.assignment import ModelPool
from drmas_train.run.policy_versions import PolicyVersions

__all__ = ["GenerationSide", "put_episodes"]


class GenerationSide:
    """Snapshots of the trained models' weights, their versions, and the pool that generates with them.

    Args:
        pool: the trainer's pool (its modules are copied once; its frozen models and tokenizers are shared).
        versions: the trainer's versions now (the snapshots start at these).
        make_backend: ``LoadedModel -> Backend``, as the trainer's pool was built (``models.<key>.backend``).
        push_every: ``{model_id: k}``: push that model's weights after every k-th of its updates (default 1, every
            update). A model pushed less often generates with older weights: its samples are staler.

    Raises:
        ValueError: a ``push_every`` of a model that is not trained, or one < 1.
    """

    def __init__(
        self,
        pool: ModelPool,
        versions: PolicyVersions,
        make_backend: Callable[[Any], Any],
        *,
        push_every: Mapping[str, int] | None = None,
    ) -> None:
        trained = set(versions.model_ids)
        for mid, k in (push_every or {}).items():
            if mid not in trained or isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise ValueError(
                    f"push_every of {mid!r} must be an int >= 1 of a trained model ({sorted(trained)}), got {k!r}"
                )
        self.push_every = {mid: int((push_every or {}).get(mid, 1)) for mid in sorted(trained)}
        self._source = pool
        self._copies: dict[
            int, Any
        ] = {}  # id(trainer module) -> its snapshot (adapters of one base share theirs)
        models = {}
        for mid, loaded in pool.models.items():
            if mid not in trained:
                models[mid] = loaded  # frozen: never changes, never copied
                continue
            key = id(loaded.model)
            if key not in self._copies:
                # requires_grad kept as the trainer's: with the copy's parameters frozen, its generations' log-probs
                # differed from the trainer module's by ~1e-8 (seen on CPU; another kernel path, presumably), and
                # η = 0 is to be the synchronous run bit for bit
                self._copies[key] = copy.deepcopy(loaded.model)
            models[mid] = dataclasses.replace(loaded, model=self._copies[key])
        self.pool = ModelPool(
            models, {mid: make_backend(m) for mid, m in models.items()}, dict(pool.agent_model_ids)
        )
        self.held = {mid: versions[mid] for mid in sorted(trained)}  # the version of each model's snapshot

    def stamp(self, samples: list[Any]) -> None:
        """Each sample's ``policy_version`` := the version of the snapshot of its model (0 for frozen models)."""
        for s in samples:
            s.policy_version = self.held.get(s.model_id, 0)

    @torch.no_grad()
    def publish(self, versions: PolicyVersions, updated: set[str]) -> list[str]:
        """The trainer updated ``updated`` (its versions are now ``versions``): push the weights of each updated
        model whose schedule says so (``versions[m] % push_every[m] == 0``) into its snapshot.

        Returns:
            the model ids whose snapshots changed (every adapter of a pushed base), sorted.
        """
        due = {mid for mid in updated if mid in self.held and versions[mid] % self.push_every[mid] == 0}
        pushed: set[str] = set()
        modules: set[int] = set()
        for mid in sorted(due):
            module = self._source.models[mid].model
            if id(module) not in modules:
                modules.add(id(module))
                self._copies[id(module)].load_state_dict(module.state_dict())
                pushed |= {p for p in self.held if self._source.models[p].model is module}
        for mid in pushed:
            self.held[mid] = versions[mid]
        return sorted(pushed)

    def metrics(self) -> dict[str, float]:
        """``async/<model_id>/generation_version``: the version of each snapshot now."""
        return {f"async/{mid}/generation_version": float(v) for mid, v in self.held.items()}


def put_episodes(
    buffer: GroupBuffer, samples: list[Any], trajectories: list[Any], order: dict[str, int]
) -> None:
    """Put one rollout's episodes into ``buffer``, in the rollout's order (task, then group member), each with all
    of its samples; record each episode's put position in ``order`` (``traj_uid -> int``), which the trainer sorts a
    step's samples by, so that a step's samples are in the order the synchronous loop has them.

    Raises:
        BufferFull: the buffer has no free slot (never waits: one thread plays both sides).
    """
    by_traj: dict[str, list[Any]] = {t.traj_uid: [] for t in trajectories}
    for s in samples:
        by_traj[s.traj_uid].append(s)
    for t in trajectories:
        order[t.traj_uid] = len(order)
        buffer.put(t.uid, t.traj_uid, by_traj[t.traj_uid], timeout=0)
