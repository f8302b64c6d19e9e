"""The generation side of the asynchronous loop (``run.mode: async``): its own copy of each trained model's
weights, the version of each copy, episodes put into the group buffer, weight pushes from the trainer.

In the synchronous loop the rollout engine samples from the very modules the trainer updates. In the asynchronous
loop the generation side holds a **snapshot** of every trained model (a ``copy.deepcopy`` of its module, made once)
and plays episodes with it, so that a batch may be generated with weights older than the trainer's. Each sample is
stamped with the version of the snapshot that generated it (``Sample.policy_version``,
:mod:`drmas_train.run.policy_versions`), and each finished episode is ``put`` into the
:class:`~drmas_train.collect.group_buffer.GroupBuffer`, from which the trainers take whole prompt groups. When the
trainer publishes a new version of a model, :meth:`GenerationSide.publish` copies its weights into the snapshot
(``load_state_dict``: the "weight push"), on that model's own schedule (``push_every``: every update by default); a
generation thread gets them in two halves, :meth:`GenerationSide.stage` then :meth:`GenerationSide.apply_staged`.

Frozen models are not copied, their weights never change (with a generation thread, ``isolate``, they are, so that no
module is used from two threads at once). LoRA adapters on one shared base share one snapshot of
the base, as they share the trainer's module; a push of any of them pushes the module, so all of its adapters.

The rollout itself is :func:`drmas_train.collect.rollout.rollout`, unchanged, over a
:class:`~drmas_train.model.assignment.ModelPool` of the snapshots with backends built as the trainer's are.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from drmas_train.collect.group_buffer import GroupBuffer
from drmas_train.model.assignment import ModelPool
from drmas_train.model.weights import is_peft
from drmas_train.run.policy_versions import PolicyVersions

__all__ = ["GenerationSide", "EngineSide", "FrozenSide", "put_episodes", "write_async_state", "read_async_state", "ASYNC_STATE_DIR"]


def trainable_state(module: torch.nn.Module, *, clone: bool) -> dict[str, torch.Tensor]:
    """``{name: tensor}`` of all that an update can change in ``module``: a PEFT model's LoRA weights (``lora_`` in the
    name, every adapter's: PEFT lets only the *active* adapter's require grad, so ``requires_grad`` would miss the
    others; :func:`~drmas_train.model.adapters.adapter_parameters` uses the same marker), not its frozen base; any
    other model's parameters that require grad. Tied parameters appear once, under their first name. ``clone``:
    detached copies (what a staged push or a checkpoint keeps) rather than the live tensors (an immediate load)."""
    if is_peft(module):
        named = [(n, p) for n, p in module.named_parameters() if "lora_" in n]
    else:
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    return {n: (p.detach().clone() if clone else p.detach()) for n, p in named}


def load_trainable(module: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` (:func:`trainable_state`'s, or an older checkpoint's whole ``state_dict``) into ``module``.

    Raises:
        KeyError: a name ``module`` does not have.
    """
    unexpected = module.load_state_dict(dict(state), strict=False).unexpected_keys
    if unexpected:
        raise KeyError(f"weights for names the generation side's module does not have: {unexpected[:5]}")


class GenerationSide:
    """Snapshots of the trained models' weights, their versions, and the pool that generates with them.

    A push copies only what an update can change (:func:`trainable_state`): for a LoRA model the adapters, not the
    base, so a staged push or a checkpoint's lagging weights hold megabytes, not a second base.

    Args:
        pool: the trainer's pool (its trained modules are copied once; its frozen models and tokenizers are shared
            unless ``isolate``).
        versions: the trainer's versions now (the snapshots start at these).
        make_backend: ``LoadedModel -> Backend``, as the trainer's pool was built (``models.<key>.backend``).
        push_every: ``{model_id: k}``: push that model's weights after every k-th of its updates (default 1, every
            update). A model pushed less often generates with older weights: its samples are staler.
        isolate: give the generation side its own copy of every tokenizer and of every frozen module too
            (``run.overlap``: the trainer's validation and the generation thread run at the same time, and neither a
            tokenizer nor a module whose mode or active LoRA adapter a generate call switches is to be used from two
            threads at once). Costs one more copy of each frozen model.

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
        isolate: bool = False,
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
        tokenizers: dict[int, Any] = {}  # id(tokenizer) -> the generation side's copy (isolate)
        frozen_copies: dict[int, Any] = {}  # id(frozen module) -> the generation side's copy (isolate)
        for mid, loaded in pool.models.items():
            if isolate:
                if id(loaded.tokenizer) not in tokenizers:
                    tokenizers[id(loaded.tokenizer)] = copy.deepcopy(loaded.tokenizer)
                loaded = dataclasses.replace(loaded, tokenizer=tokenizers[id(loaded.tokenizer)])
            if mid not in trained:
                if isolate:  # never changes, so never pushed; copied only to be used by one thread
                    if id(loaded.model) not in frozen_copies:
                        frozen_copies[id(loaded.model)] = copy.deepcopy(loaded.model)
                    loaded = dataclasses.replace(loaded, model=frozen_copies[id(loaded.model)])
                models[mid] = loaded  # frozen: never changes, shared unless isolated
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
        self._staged: dict[int, dict[str, torch.Tensor]] = {}  # id(trainer module) -> weights copied, not yet loaded
        self._staged_versions: dict[str, int] = {}  # model id -> the version its staged weights are

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
        pushed: set[str] = set()
        for module, mids in self._due(versions, updated):
            load_trainable(self._copies[id(module)], trainable_state(module, clone=False))
            pushed |= mids
        for mid in pushed:
            self.held[mid] = versions[mid]
        return sorted(pushed)

    def _due(self, versions: PolicyVersions, updated: set[str]) -> list[tuple[Any, set[str]]]:
        """``[(trainer module, every model id on it)]`` of the updated models whose push schedule says push now."""
        due = {mid for mid in updated if mid in self.held and versions[mid] % self.push_every[mid] == 0}
        out: list[tuple[Any, set[str]]] = []
        for mid in sorted(due):
            module = self._source.models[mid].model
            if all(module is not m for m, _ in out):
                out.append((module, {p for p in self.held if self._source.models[p].model is module}))
        return out

    @torch.no_grad()
    def stage(self, versions: PolicyVersions, updated: set[str]) -> list[str]:
        """:meth:`publish` in two halves, for a generation thread (``run.overlap``): copy the due weights now (the
        trainer goes on updating its modules) and load them at :meth:`apply_staged`, which the generation thread
        calls between batches. A later stage of the same module replaces an unloaded one.

        Returns:
            the model ids whose snapshots will change, sorted.
        """
        staged: set[str] = set()
        for module, mids in self._due(versions, updated):
            self._staged[id(module)] = trainable_state(module, clone=True)
            staged |= mids
        self._staged_versions.update({mid: versions[mid] for mid in staged})
        return sorted(staged)

    @torch.no_grad()
    def apply_staged(self) -> list[str]:
        """Load the weights :meth:`stage` copied into the snapshots (their versions become the staged ones).

        Returns:
            the model ids whose snapshots changed, sorted.
        """
        for key, state in self._staged.items():
            load_trainable(self._copies[key], state)
        changed = sorted(self._staged_versions)
        self.held.update(self._staged_versions)
        self._staged.clear()
        self._staged_versions.clear()
        return changed

    def frozen(self, versions: PolicyVersions) -> FrozenSide:
        """What a checkpoint keeps of the side now (:func:`write_async_state`), with a staged push counted as
        loaded: the versions, and a copy of the weights of each snapshot still older than its trainer."""
        held = {**self.held, **self._staged_versions}
        lagging: dict[str, dict[str, torch.Tensor]] = {}
        for mid, v in held.items():
            module = self._source.models[mid].model
            if v != versions[mid] and not any(self._source.models[o].model is module for o in lagging):
                # a staged push counts as loaded: its weights are the staged copy, not the snapshot's yet
                staged = self._staged.get(id(module))
                lagging[mid] = ({k: t.clone() for k, t in staged.items()} if staged is not None
                                else trainable_state(self._copies[id(module)], clone=True))  # fmt: skip
        return FrozenSide(held, lagging)

    @torch.no_grad()
    def restore(self, held: Mapping[str, int], weights: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """After a resume (the snapshots were copied from the resumed trainer weights): the versions the
        checkpointed snapshots had, and the weights of those that lagged (:attr:`FrozenSide.lagging`)."""
        for mid, state in weights.items():
            load_trainable(self._copies[id(self._source.models[mid].model)], state)
        self.held.update({mid: int(v) for mid, v in held.items() if mid in self.held})

    def metrics(self) -> dict[str, float]:
        """``async/<model_id>/generation_version``: the version of each snapshot now."""
        return {f"async/{mid}/generation_version": float(v) for mid, v in self.held.items()}


class EngineSide:
    """The generation side of the Ray path (``distributed.enabled: true``): the trained models' generation engines.

    On the Ray path the weights that generate are already a copy apart from the trainer's: each worker group's
    generation engines (HF or vLLM actors) hold the version its training ranks last pushed
    (:meth:`drmas_train.distributed.worker_group.WorkerGroup.push`). So this side copies nothing: its pool is the
    trainer's (Ray backends for the trained models).

    * Inline (``run.overlap: false``): :meth:`~drmas_train.distributed.updater.RayUpdater.update` pushes after every
      update, and :meth:`publish` only records the versions: :class:`GenerationSide` with ``push_every`` 1. The
      schedule is then the same on both paths: batch k is generated with version max(0, k - η).
    * Generation thread (``run.overlap: true``): the updater pushes nothing (``defer_pushes``, set here);
      :meth:`stage` gathers each updated model's weights into Ray's object store (the engines keep theirs) and
      :meth:`apply_staged`, which the generation thread calls between two batches, pushes them. A batch is thus
      generated with one version of each model, as on the single-process path.

    Args:
        pool: the trainer's pool. versions: the trainer's versions now (the engines hold these). updater: the run's
        :class:`~drmas_train.distributed.updater.RayUpdater`. staged: stage pushes (``run.overlap``).
    """

    def __init__(self, pool: ModelPool, versions: PolicyVersions, updater: Any = None, *, staged: bool = False) -> None:
        self.pool = pool
        self.push_every = dict.fromkeys(versions.model_ids, 1)
        self.held = {mid: versions[mid] for mid in sorted(versions.model_ids)}  # the version each model's engines hold
        self.staged = staged
        if staged:
            updater.defer_pushes = True
        self._staged: dict[str, tuple[Any, int]] = {}  # model id -> (gathered weights ref, its version), not pushed

    def stamp(self, samples: list[Any]) -> None:
        """Each sample's ``policy_version`` := the version its model's engines hold (0 for frozen models)."""
        for s in samples:
            s.policy_version = self.held.get(s.model_id, 0)

    def publish(self, versions: PolicyVersions, updated: set[str]) -> list[str]:
        """Inline: the updater pushed the updated models' weights to their engines with the update; record their
        versions.

        Returns:
            the updated model ids, sorted.
        """
        pushed = sorted(m for m in updated if m in self.held)
        for mid in pushed:
            self.held[mid] = versions[mid]
        return pushed

    def stage(self, versions: PolicyVersions, updated: set[str]) -> list[str]:
        """``run.overlap``: gather each updated model's weights now (an object-store ref; the ranks go on training)
        for :meth:`apply_staged` to push. A later stage of the same model replaces an unpushed one.

        Returns:
            the model ids whose engines will change, sorted.
        """
        due = sorted(m for m in updated if m in self.held)
        for mid in due:
            self._staged[mid] = (self.pool.backends[mid].group.stage(), versions[mid])
        return due

    def apply_staged(self) -> list[str]:
        """Push the weights :meth:`stage` gathered to their engines (their versions become the staged ones).

        Returns:
            the model ids whose engines changed, sorted.
        """
        changed = sorted(self._staged)
        for mid in changed:
            ref, version = self._staged.pop(mid)
            self.pool.backends[mid].group.push(ref)
            self.held[mid] = version
        return changed

    def frozen(self, versions: PolicyVersions) -> FrozenSide:
        """The versions the engines hold, a staged push counted as pushed; no weights: after a resume or a rewind
        the engines get the checkpoint's, which are the trainer's (between steps the engines hold the trainer's
        weights or have them staged)."""
        return FrozenSide({**self.held, **{m: v for m, (_, v) in self._staged.items()}}, {})

    def restore(self, held: Mapping[str, int], weights: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """After a resume or a rewind: the versions the engines held at the checkpoint.

        Raises:
            ValueError: ``weights`` is not empty (a checkpoint of the single-process path whose generation lagged:
                the engines can only hold the trainer's weights).
        """
        if weights:
            raise ValueError(f"the checkpoint holds lagging generation weights of {sorted(weights)} (written by the "
                             "single-process asynchronous loop); the Ray path's engines hold the trainer's weights")  # fmt: skip
        self._staged.clear()
        self.held.update({mid: int(v) for mid, v in held.items() if mid in self.held})

    def metrics(self) -> dict[str, float]:
        """``async/<model_id>/generation_version``: the version each model's engines hold now."""
        return {f"async/{mid}/generation_version": float(v) for mid, v in self.held.items()}


@dataclasses.dataclass(frozen=True)
class FrozenSide:
    """A :class:`GenerationSide` as a checkpoint keeps it (:meth:`GenerationSide.frozen`): each trained model's
    snapshot version, and the weights of the snapshots older than their trainer."""

    held: dict[str, int]
    lagging: dict[str, dict[str, torch.Tensor]]  # model id -> trainable_state (one per module: one of its adapters)


def put_episodes(
    buffer: GroupBuffer, samples: list[Any], trajectories: list[Any], order: dict[str, int], first: int
) -> int:
    """Put one rollout's episodes into ``buffer``, in the rollout's order (task, then group member), each with all
    of its samples; record each episode's put position (``first``, ``first + 1``, ...) in ``order``
    (``traj_uid -> int``), which the trainer sorts a step's samples by, so that a step's samples are in the order
    the synchronous loop has them. Returns the next position.

    Raises:
        BufferFull: the buffer has no free slot (never waits: one thread plays both sides).
    """
    by_traj: dict[str, list[Any]] = {t.traj_uid: [] for t in trajectories}
    for s in samples:
        by_traj[s.traj_uid].append(s)
    for k, t in enumerate(trajectories):
        order[t.traj_uid] = first + k
        buffer.put(t.uid, t.traj_uid, by_traj[t.traj_uid], timeout=0)
    return first + len(trajectories)


#: the folder of a checkpoint that holds the asynchronous loop's state (:func:`write_async_state`)
ASYNC_STATE_DIR = "async"


def write_async_state(folder: Path, snapshot: Mapping[str, Any]) -> None:
    """The asynchronous loop's state at the end of a step into checkpoint ``folder``/``async/``: the group buffer's
    samples (``buffer_samples.jsonl``, :func:`~drmas_train.collect.sample_io.save_samples`), its structure and the
    loop's counters (``state.json``), and the generation side's lagging snapshots (``generation_weights.pt``, only
    when some snapshot is older than its trainer).

    Args:
        snapshot: ``{"buffer": GroupBuffer.state_dict(), "generated": batches played, "order": {traj_uid: put
            position} of the buffered episodes, "positions": the next put position, "plays": [model ids], "side": the
            generation side as :meth:`GenerationSide.frozen` kept it}``.
    """
    from drmas_train.collect.sample_io import save_samples

    out = folder / ASYNC_STATE_DIR
    out.mkdir()
    buffer, flat, groups = snapshot["buffer"], [], {}
    for uid, g in buffer["groups"].items():
        index = {}
        for mid, part in g["samples"].items():
            index[mid] = list(range(len(flat), len(flat) + len(part)))
            flat.extend(part)
        groups[uid] = {**g, "samples": index}
    save_samples(flat, out / "buffer_samples.jsonl")
    side = snapshot["side"]
    state = {"buffer": {**buffer, "groups": groups}, "generated": snapshot["generated"], "order": snapshot["order"],
             "positions": snapshot["positions"],
             "plays": sorted(snapshot["plays"]), "held": dict(side.held)}  # fmt: skip
    (out / "state.json").write_text(json.dumps(state))
    if side.lagging:
        torch.save(side.lagging, out / "generation_weights.pt")


def read_async_state(folder: Path) -> dict[str, Any] | None:
    """:func:`write_async_state`'s state of checkpoint ``folder``, the buffer's samples back in place
    (``{"buffer", "generated", "order", "positions", "plays", "held", "weights"}``), or None for a checkpoint of a synchronous
    run (no ``async/`` folder)."""
    from drmas_train.collect.sample_io import load_samples

    src = folder / ASYNC_STATE_DIR
    if not src.is_dir():
        return None
    state = json.loads((src / "state.json").read_text())
    flat = load_samples(src / "buffer_samples.jsonl")
    for g in state["buffer"]["groups"].values():
        g["samples"] = {mid: [flat[i] for i in index] for mid, index in g["samples"].items()}
    weights = src / "generation_weights.pt"
    state["weights"] = torch.load(weights, weights_only=True) if weights.is_file() else {}
    return state
