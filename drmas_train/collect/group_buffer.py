"""A bounded buffer of prompt groups between generation and training: whole groups only, staleness-bounded per model.

The building block of an asynchronous loop (docs/async.md; ``run.mode: async`` uses it). Generation workers
:meth:`GroupBuffer.put` each episode as it completes (all of its samples: every agent's calls, whatever models
made them); each model's trainer :meth:`GroupBuffer.get` s the prompt groups of its model that are ready.

**Whole groups.** A prompt group is the ``group_size`` episodes (distinct ``traj_uid``) of one task (``uid``). GRPO's
and Dr. MAS's advantages are statistics over a whole group (Dr. MAS: per group and agent), so a model's part of a
group, all of its samples in the group's episodes, is released only once every episode of the group is in. A
group is complete when its ``group_size``-th episode arrives; one more episode of it is an error (a duplicate).

**Staleness.** A sample's staleness is its model's trainer version minus the version that generated it
(``Sample.policy_version``, :mod:`drmas_train.run.policy_versions`). Each model has a bound ``max_staleness`` (η;
None = unbounded). When a model's trainer asks for groups at version v, every complete group of that model whose
oldest sample is more than η versions behind v is **dropped** (counted, and reported to ``on_drop``): the whole
group, never one sample of it, as a group with a member missing would bias its statistics. Versions only grow,
so a group beyond the bound can never come back into it. Only dropping is offered: a staleness-dependent
down-weighting would need a principled weight, and the principled correction of samples *within* the bound is the
decoupled objective's importance weight (``algorithm.behaviour_weight_cap``, :mod:`drmas_train.algorithm.losses`);
AReaL likewise bounds staleness (its ``max_head_offpolicyness``) and corrects with that weight.

**Capacity and back-pressure.** The buffer holds at most ``capacity`` groups: a group takes a slot with its first
episode and frees it once every model's part of it has been released or dropped (a model without a call in the
group has nothing to take). A :meth:`put` that opens a new group waits while all slots are taken (up to
``timeout`` seconds, then :class:`BufferFull`); a put into a group already open never waits, as its slot was
taken when it opened, so producers that finish the groups they started cannot deadlock against a full buffer.
Producers block, consumers block: the rule a Ray producer/consumer pair needs when the buffer lives in a
threaded actor (``max_concurrency`` > 1) or in one process with threads. Thread-safe (one
:class:`threading.Condition`).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from drmas_train.collect.samples import Sample

__all__ = ["GroupBuffer", "BufferFull", "BufferClosed", "ModelCounts"]


class BufferFull(TimeoutError):
    """A :meth:`GroupBuffer.put` that would open a group beyond the capacity waited ``timeout`` seconds in vain."""


class BufferClosed(RuntimeError):
    """The buffer was closed (:meth:`GroupBuffer.close`) while a put or get waited, or before it was called."""


@dataclass
class ModelCounts:
    """What one model's trainer took from the buffer, and what was dropped before it could."""

    released_groups: int = 0
    released_samples: int = 0
    dropped_groups: int = 0
    dropped_samples: int = 0
    skipped_groups: int = 0
    """groups within the bound passed over while the model's trainer was busy (:meth:`GroupBuffer.skip`)."""
    skipped_samples: int = 0


@dataclass
class _Group:
    episodes: set[str] = field(default_factory=set)  # traj_uids in
    samples: dict[str, list[Sample]] = field(
        default_factory=dict
    )  # model_id -> its samples, in arrival order
    pending: set[str] = field(default_factory=set)  # models whose part is not yet released or dropped


#: ``on_drop(model_id, uid, samples, version)``: a model's part of a group dropped at trainer version ``version``.
DropHook = Callable[[str, str, list[Sample], int], None]


class GroupBuffer:
    """Complete prompt groups per model, within each model's staleness bound, in a bounded buffer.

    Args:
        group_size: episodes per prompt group (G, ``rollout.group_size``), >= 1.
        max_staleness: ``{model_id: η}``, the trained models and their bounds (None = unbounded, 0 = on-policy
            only). Samples of models not listed (frozen ones) are not kept.
        capacity: groups held at most (open or complete, not yet taken by every model), >= 1.
        on_drop: called (under the buffer's lock; keep it short) for each model part of a group it drops.

    Raises:
        ValueError: a size or bound out of range.
    """

    def __init__(
        self,
        group_size: int,
        max_staleness: Mapping[str, int | None],
        capacity: int,
        *,
        on_drop: DropHook | None = None,
    ) -> None:
        if group_size < 1 or capacity < 1:
            raise ValueError(f"group_size and capacity must be >= 1, got {group_size} and {capacity}")
        for mid, eta in max_staleness.items():
            if eta is not None and (isinstance(eta, bool) or not isinstance(eta, int) or eta < 0):
                raise ValueError(
                    f"max_staleness of {mid!r} must be an int >= 0 or None (unbounded), got {eta!r}"
                )
        self.group_size, self.capacity = group_size, capacity
        self.max_staleness = dict(max_staleness)
        self._on_drop = on_drop
        self._cond = threading.Condition()
        self._groups: dict[str, _Group] = {}  # uid -> group held (open or complete)
        self._ready: dict[str, OrderedDict[str, None]] = {
            m: OrderedDict() for m in self.max_staleness
        }  # FIFO
        self._closed_uids: set[str] = set()  # groups complete and freed (every uid seen: a few bytes each)
        self._counts = {m: ModelCounts() for m in self.max_staleness}
        self._versions = dict.fromkeys(self.max_staleness, 0)  # the latest trainer version each get reported
        self._closed = False

    # -- producer ------------------------------------------------------------------------------------------------
    def put(
        self, uid: str, traj_uid: str, samples: Sequence[Sample], *, timeout: float | None = None
    ) -> None:
        """Add one finished episode (all of its samples; possibly none of a trained model).

        Args:
            uid, traj_uid: the episode's prompt group and trajectory ids; every sample must carry them.
            samples: the episode's samples, each with ``model_id`` and ``policy_version``.
            timeout: seconds to wait for a free slot when the episode opens a new group (None = forever,
                0 = not at all).

        Raises:
            ValueError: a sample of another episode, an episode put twice, or one more episode than
                ``group_size`` for ``uid``.
            BufferFull: no slot freed within ``timeout``. BufferClosed: the buffer is closed.
        """
        for s in samples:
            if s.uid != uid or s.traj_uid != traj_uid:
                raise ValueError(
                    f"a sample of episode ({s.uid!r}, {s.traj_uid!r}) put as episode ({uid!r}, {traj_uid!r})"
                )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            done = uid in self._groups and len(self._groups[uid].episodes) == self.group_size
            if done or uid in self._closed_uids:
                raise ValueError(
                    f"group {uid!r} already had its {self.group_size} episodes; episode {traj_uid!r} is one too many"
                )
            while uid not in self._groups and len(self._groups) >= self.capacity and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise BufferFull(
                        f"group buffer full ({self.capacity} groups held); episode {traj_uid!r} of new group {uid!r} "
                        f"waited {timeout} s for a free slot"
                    )
                self._cond.wait(left)
            if self._closed:
                raise BufferClosed("the group buffer is closed")
            group = self._groups.setdefault(uid, _Group())
            if traj_uid in group.episodes:
                raise ValueError(f"episode {traj_uid!r} of group {uid!r} was put twice")
            group.episodes.add(traj_uid)
            for s in samples:
                if s.model_id in self.max_staleness:
                    group.samples.setdefault(s.model_id, []).append(s)
            if len(group.episodes) == self.group_size:  # complete: each model's part is ready
                group.pending = set(group.samples)
                for mid in group.pending:
                    self._ready[mid][uid] = None
                self._free_if_done(uid)
                self._cond.notify_all()

    # -- consumers -----------------------------------------------------------------------------------------------
    def try_get(self, model_id: str, version: int, max_groups: int) -> list[list[Sample]]:
        """Up to ``max_groups`` complete groups of ``model_id`` within its bound at trainer ``version``, oldest
        complete first, without waiting; the stale complete ones are dropped first (all of them, counted).

        Args:
            model_id: a trained model (a key of ``max_staleness``).
            version: its trainer's version now (never lower than an earlier call's).
            max_groups: >= 1.

        Returns:
            the groups: each the model's samples of one complete prompt group, in arrival order.

        Raises:
            KeyError: an unknown model. ValueError: a version lower than before, or ``max_groups`` < 1.
            BufferClosed: the buffer is closed.
        """
        with self._cond:
            self._drop_stale(model_id, version, max_groups)
            return self._release(model_id, max_groups)

    def get(
        self, model_id: str, version: int, n_groups: int, *, timeout: float | None = None
    ) -> list[list[Sample]]:
        """Exactly ``n_groups`` groups, as :meth:`try_get`, waiting until that many are ready (stale ones are
        dropped as they complete); none is taken before all are there.

        Raises:
            TimeoutError: fewer than ``n_groups`` ready within ``timeout`` seconds (nothing taken).
            BufferClosed: the buffer is closed, or was closed while waiting. KeyError, ValueError: as
            :meth:`try_get`.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._drop_stale(model_id, version, n_groups)
                if len(self._ready[model_id]) >= n_groups:
                    return self._release(model_id, n_groups)
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        f"{len(self._ready[model_id])} of {n_groups} groups of model {model_id!r} ready after {timeout} s"
                    )
                self._cond.wait(left)

    def skip(self, model_id: str, version: int, keep: int) -> int:
        """Pass over all but the newest ``keep`` complete groups of ``model_id`` within its bound (the stale ones
        dropped first, as :meth:`try_get`): what per-model pacing does for a model whose update is still running,
        so that its backlog stays one batch and its next update takes the freshest groups. Counted as
        ``skipped_groups`` / ``skipped_samples`` (and reported to ``on_drop``).

        Returns:
            the number of groups skipped.

        Raises:
            KeyError, ValueError, BufferClosed: as :meth:`try_get` (``keep`` >= 1).
        """
        with self._cond:
            self._drop_stale(model_id, version, keep)
            ready = self._ready[model_id]
            skipped = list(ready)[: max(0, len(ready) - keep)]  # the oldest complete ones
            for uid in skipped:
                self._discard(model_id, uid, version, skipped=True)
            return len(skipped)

    def counts(self) -> dict[str, ModelCounts]:
        """Per model: groups and samples released, dropped and skipped so far (copies)."""
        with self._cond:
            return {m: ModelCounts(**vars(c)) for m, c in self._counts.items()}

    def held_groups(self) -> int:
        """Groups holding a slot now (open, or complete and not yet taken by every model)."""
        with self._cond:
            return len(self._groups)

    def state_dict(self) -> dict[str, Any]:
        """Everything the buffer holds, for a checkpoint: plain containers, except each held group's samples (the
        :class:`Sample` objects themselves; the caller stores them, e.g. with
        :func:`~drmas_train.collect.sample_io.save_samples`). :meth:`load_state_dict` restores it."""
        with self._cond:
            return {
                "group_size": self.group_size,
                "groups": {
                    uid: {
                        "episodes": sorted(g.episodes),
                        "samples": {m: list(part) for m, part in g.samples.items()},
                        "pending": sorted(g.pending),
                    }
                    for uid, g in self._groups.items()
                },
                "ready": {m: list(r) for m, r in self._ready.items()},
                "closed_uids": sorted(self._closed_uids),
                "counts": {m: dict(vars(c)) for m, c in self._counts.items()},
                "versions": dict(self._versions),
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into this (empty) buffer; models of the state that this buffer does not train
        are left out, models this buffer trains that the state lacks start empty.

        Raises:
            ValueError: a state of another ``group_size``, or a buffer that already holds something.
        """
        with self._cond:
            if state["group_size"] != self.group_size:
                raise ValueError(
                    f"a group buffer state of group_size {state['group_size']} loaded into one of {self.group_size}"
                )
            if self._groups or self._closed_uids:
                raise ValueError("load_state_dict needs an empty group buffer")
            for uid, g in state["groups"].items():
                samples = {m: list(p) for m, p in g["samples"].items() if m in self.max_staleness}
                self._groups[uid] = _Group(
                    set(g["episodes"]), samples, {m for m in g["pending"] if m in samples}
                )
            for m, uids in state["ready"].items():
                if m in self._ready:
                    self._ready[m] = OrderedDict.fromkeys(uids)
            self._closed_uids = set(state["closed_uids"])
            for m, c in state["counts"].items():
                if m in self._counts:
                    self._counts[m] = ModelCounts(**c)
            self._versions.update({m: v for m, v in state["versions"].items() if m in self._versions})

    def close(self) -> None:
        """Wake every waiting put and get with :class:`BufferClosed`; later calls of put and get raise it too."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- internals (under the lock) ------------------------------------------------------------------------------
    def _drop_stale(self, model_id: str, version: int, n_groups: int) -> None:
        """Check a consumer's call, record its version, and drop every complete group of ``model_id`` beyond its
        bound at ``version`` (versions only grow, so none could come back within it)."""
        if model_id not in self._ready:
            raise KeyError(
                f"model {model_id!r} is not trained through this buffer; trained: {sorted(self._ready)}"
            )
        if n_groups < 1:
            raise ValueError(f"the number of groups asked for must be >= 1, got {n_groups}")
        if version < self._versions[model_id]:
            raise ValueError(
                f"trainer version of {model_id!r} went back from {self._versions[model_id]} to {version}"
            )
        if self._closed:
            raise BufferClosed("the group buffer is closed")
        self._versions[model_id] = version
        eta, ready = self.max_staleness[model_id], self._ready[model_id]
        if eta is None:
            return
        for uid in list(ready):
            if version - min(s.policy_version for s in self._groups[uid].samples[model_id]) > eta:
                self._discard(model_id, uid, version, skipped=False)

    def _discard(self, model_id: str, uid: str, version: int, *, skipped: bool) -> None:
        """Take ``model_id``'s part of ready group ``uid`` out unused at trainer ``version``: counted as skipped
        (:meth:`skip`) or dropped (beyond the bound), reported to ``on_drop``."""
        del self._ready[model_id][uid]
        part, counts = self._groups[uid].samples[model_id], self._counts[model_id]
        if skipped:
            counts.skipped_groups += 1
            counts.skipped_samples += len(part)
        else:
            counts.dropped_groups += 1
            counts.dropped_samples += len(part)
        if self._on_drop is not None:
            self._on_drop(model_id, uid, list(part), version)
        self._done(uid, model_id)

    def _release(self, model_id: str, max_groups: int) -> list[list[Sample]]:
        """Up to ``max_groups`` ready groups of ``model_id``, oldest complete first."""
        ready, counts, out = self._ready[model_id], self._counts[model_id], []
        while ready and len(out) < max_groups:
            uid, _ = ready.popitem(last=False)
            part = self._groups[uid].samples[model_id]
            counts.released_groups += 1
            counts.released_samples += len(part)
            out.append(list(part))
            self._done(uid, model_id)
        return out

    def _done(self, uid: str, model_id: str) -> None:
        self._groups[uid].pending.discard(model_id)
        self._free_if_done(uid)

    def _free_if_done(self, uid: str) -> None:
        group = self._groups[uid]
        if len(group.episodes) == self.group_size and not group.pending:
            del self._groups[uid]
            self._closed_uids.add(uid)
            self._cond.notify_all()
