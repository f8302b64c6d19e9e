"""Sharded checkpoints of a distributed model with ``torch.distributed.checkpoint`` (DCP), and the Hugging Face bridge.

A worker group trains one model on N ranks (FSDP2 ``fully_shard``, DDP, or a plain module on one rank). Its
checkpoint is one DCP directory written by all ranks together, each rank writing only its own shards::

    <path>/
        .metadata            DCP's global index (written last, by rank 0)
        __<rank>_0.distcp    the shards each rank wrote
        drmas_sharded.json   {"format", "world_size", "wrapping", "model_class", "has_optimizer",
                              "optimizer_state", "has_schedule", "torch"}

State layout inside it (canonical FQNs from ``torch.distributed.checkpoint.state_dict``, so the wrapping, the
number of ranks and the sharding may all differ between save and load; DCP reshards on load):

    ``model.<fqn>``       the model's parameters and persistent buffers (``get_model_state_dict``)
    ``optim.<...>``       the optimizer state keyed by parameter FQN (``get_optimizer_state_dict``); absent when
                          the optimizer never stepped (``optimizer_state: false``): there is nothing to restore
    ``schedule``          for a :class:`~drmas_train.algorithm.optim.ModelOptimizer`: the LR scheduler state and the
                          skipped-step counter (pickled by DCP, written once)

Atomicity: every rank writes into ``.<name>.partial`` next to ``path``; after a barrier rank 0 adds
``drmas_sharded.json`` and renames the folder to ``path`` (``os.rename`` of a directory is atomic on POSIX; on
several nodes ``path`` must be on a shared filesystem). A process killed mid-write leaves at most a
``.partial`` folder, which no loader accepts and the next save removes; :func:`load_sharded` and
:func:`export_hf` accept only folders that hold both DCP's ``.metadata`` and ``drmas_sharded.json``.

:func:`export_hf` turns a checkpoint into a Hugging Face folder (``config.json`` + safetensors + tokenizer) that
:func:`drmas_train.model.models.load_model`, the single-process trainer and ``drmas eval --model DIR`` load;
:func:`import_hf` goes the other way (HF weights into an already wrapped model, read once on rank 0 and
broadcast). The pattern follows the PyTorch DCP recipe (``get_state_dict`` / ``dcp.save`` / ``set_state_dict``);
the reference implementation (``langfengQ/DrMAS verl/utils/checkpoint/fsdp_checkpoint_manager.py``) instead
saves one ``torch.save`` file per rank and merges them with ``scripts/model_merger.py``.

FSDP2 on CPU: ``fully_shard`` runs on CPU tensors with the gloo backend in torch 2.13 (forward, backward,
reduce-scatter of gradients, ``clip_grad_norm_`` over DTensors, AdamW, and the DCP round trip here);
``tests/drmas_train/distributed/test_checkpoint.py`` exercises it on 2 gloo ranks.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from drmas_train.model.weights import fsync_dir, fsync_tree, load_weights

__all__ = ["save_sharded", "load_sharded", "export_hf", "import_hf", "is_sharded_checkpoint", "FORMAT"]

#: format tag written into ``drmas_sharded.json``.
FORMAT = "drmas-dcp/1"
_INFO = "drmas_sharded.json"
#: files of a Hugging Face folder that hold weights (never copied from ``model_config_dir`` by :func:`export_hf`).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".distcp", ".gguf")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank(group: Any) -> int:
    return dist.get_rank(group) if _distributed() else 0


def _world_size(group: Any) -> int:
    return dist.get_world_size(group) if _distributed() else 1


def _barrier(group: Any) -> None:
    if _distributed():
        dist.barrier(group=group)


def _on_rank0(fn: Any, group: Any, what: str) -> None:
    """Run ``fn`` on rank 0 of ``group`` and tell every rank whether it worked (a broadcast, so it is also a
    barrier): a failure on rank 0 raises on every rank instead of leaving the others waiting."""
    error: BaseException | None = None
    if _rank(group) == 0:
        try:
            fn()
        except Exception as err:  # re-raised below on rank 0, reported on the others
            error = err
    if _distributed():
        box = [None if error is None else f"{type(error).__name__}: {error}"]
        dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
        if error is None and box[0] is not None:
            raise RuntimeError(f"rank 0 failed {what} the sharded checkpoint: {box[0]}")
    if error is not None:
        raise error


def _wrapping(model: torch.nn.Module) -> str:
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, FSDPModule):
        return "fsdp2"
    if isinstance(model, DistributedDataParallel):
        return "ddp"
    return "plain"


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if _wrapping(model) == "ddp" else model


def _model_class(model: torch.nn.Module) -> str:
    """The user's class name: FSDP2 swaps ``Cls`` for a generated ``FSDPCls(FSDPModule, Cls)``."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(_unwrapped(model)).__mro__ if not issubclass(c, FSDPModule)).__name__


def _split_optimizer(optimizer: Any) -> tuple[torch.optim.Optimizer | None, Any]:
    """``(torch optimizer, ModelOptimizer or None)`` from a torch optimizer, a ModelOptimizer or None."""
    if optimizer is None:
        return None, None
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer, None
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, torch.optim.Optimizer) and hasattr(optimizer, "scheduler"):
        return inner, optimizer
    raise TypeError(
        "optimizer must be a torch.optim.Optimizer, a drmas_train.algorithm.optim.ModelOptimizer or None, "
        f"got {type(optimizer).__name__}"
    )


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a complete checkpoint written by :func:`save_sharded` (a ``.partial`` never is)."""
    path = Path(path)
    return (path / ".metadata").is_file() and (path / _INFO).is_file()


def _require_checkpoint(path: Path) -> dict[str, Any]:
    if not is_sharded_checkpoint(path):
        why = "does not exist" if not path.exists() else "is not a complete sharded checkpoint (no .metadata or " + _INFO + ")"
        raise FileNotFoundError(f"sharded checkpoint {str(path)!r} {why}; write one with save_sharded()")
    info = json.loads((path / _INFO).read_text())
    if info.get("format") != FORMAT:
        raise ValueError(f"sharded checkpoint {str(path)!r} has format {info.get('format')!r}; this drmas reads {FORMAT!r}")
    return info


@contextlib.contextmanager
def _dcp_quiet() -> Iterator[None]:
    """Silence DCP's "assuming the intent is to save/load in a single process" warning: that is our intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _stored_keys(path: Path) -> dict[str, Any]:
    """Flattened DCP keys -> their storage metadata (``TensorStorageMetadata`` or ``BytesStorageMetadata``)."""
    return dict(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def _resident(owner: Any) -> contextlib.AbstractContextManager:
    """:meth:`~drmas_train.algorithm.optim.ModelOptimizer.resident` of a ModelOptimizer; nothing for a bare torch one."""
    return owner.resident() if owner is not None else contextlib.nullcontext()


def save_sharded(model: torch.nn.Module, optimizer: Any, path: str | Path, *, process_group: Any = None) -> None:
    """Write the model's (and optimizer's) sharded state to the directory ``path``; collective, atomic.

    Every rank of the group calls it with its own shard (FSDP2), its replica (DDP, written once) or the whole
    model (a single process with no process group). An existing checkpoint at ``path`` is replaced: it is
    renamed aside, the new one renamed in, then the old one deleted.

    Args:
        model: a ``fully_shard``-ed (FSDP2), ``DistributedDataParallel`` or plain ``nn.Module``.
        optimizer: its ``torch.optim.Optimizer``, a :class:`~drmas_train.algorithm.optim.ModelOptimizer` (its LR scheduler
            and skipped-step counter are saved too) or None (weights only, e.g. a frozen model).
        path: the checkpoint directory (its parent is created). On several nodes: a shared filesystem.
        process_group: the group whose ranks save together (None: the default group, or no group at all).

    Raises:
        TypeError: ``optimizer`` of another type.
        torch.distributed.checkpoint.api.CheckpointException: a rank failed to write (raised on every rank; the
            partial folder is removed and ``path`` is untouched).
    """
    torch_opt, owner = _split_optimizer(optimizer)
    final = Path(path)
    tmp = final.parent / f".{final.name}.partial"

    def prepare() -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a save killed earlier
        tmp.mkdir()

    def publish() -> None:
        info = {
            "format": FORMAT,
            "world_size": _world_size(process_group),
            "wrapping": _wrapping(model),
            "model_class": _model_class(model),
            "has_optimizer": torch_opt is not None,
            "optimizer_state": "optim" in state,
            "has_schedule": owner is not None,
            "torch": torch.__version__,
        }
        (tmp / _INFO).write_text(json.dumps(info, indent=1) + "\n")
        fsync_tree(tmp)  # every rank's files durable before the rename publishes them (a power loss, not only a kill)
        old = final.parent / f".{final.name}.old"
        replaced = final.exists()
        if replaced:
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        try:
            os.rename(tmp, final)
        except BaseException:
            if replaced:
                os.rename(old, final)  # put the previous checkpoint back
            raise
        fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)

    _on_rank0(prepare, process_group, "preparing")
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    try:
        with _resident(owner):  # an offloaded AdamW state on its parameters' devices while DCP reads it
            # An optimizer that never stepped has no state: save none (asking DCP for it would run a zero step that
            # advances Adam's step count); loading then leaves the (fresh) optimizer as it is.
            if torch_opt is not None and torch_opt.state:
                state["optim"] = get_optimizer_state_dict(model, torch_opt)
            if owner is not None:
                state["schedule"] = {"scheduler": owner.scheduler.state_dict(), "skipped_steps": int(owner.skipped_steps)}
            with _dcp_quiet():
                dcp.save(state, checkpoint_id=str(tmp), process_group=process_group, no_dist=not _distributed())
        _barrier(process_group)
        _on_rank0(publish, process_group, "publishing")  # every rank returns once the checkpoint is in place
    except BaseException:
        if _rank(process_group) == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_sharded(model: torch.nn.Module, optimizer: Any, path: str | Path, *, process_group: Any = None) -> None:
    """Restore a checkpoint written by :func:`save_sharded` into ``model`` (and ``optimizer``) in place; collective.

    The loading group may differ from the saving one in size and wrapping (FSDP2 <-> DDP <-> plain): DCP
    reads each rank's part of every tensor from whatever shards hold it. Call it before the first backward or
    after an optimizer step (``set_state_dict``'s rule); a fresh optimizer's state is initialised first.

    Args:
        model: the wrapped (or plain) model, same architecture as the saved one.
        optimizer: its ``torch.optim.Optimizer``, a :class:`~drmas_train.algorithm.optim.ModelOptimizer` (scheduler and
            skipped-step counter restored when saved) or None (weights only; a saved optimizer state is ignored).
        path: a checkpoint directory.
        process_group: the group whose ranks load together (None: the default group, or none).

    Raises:
        FileNotFoundError: ``path`` is not a complete checkpoint (missing, or an interrupted ``.partial``).
        ValueError: the checkpoint lacks parameters of ``model`` (another architecture) or has no optimizer
            state while one was asked for; or an unknown format.
    """
    path = Path(path)
    info = _require_checkpoint(path)
    torch_opt, owner = _split_optimizer(optimizer)
    stored = _stored_keys(path)
    state: dict[str, Any] = {"model": get_model_state_dict(model)}
    missing = [k for k in state["model"] if f"model.{k}" not in stored]
    if missing:
        raise ValueError(
            f"sharded checkpoint {str(path)!r} has no weights for {missing[:3]} (+{max(len(missing) - 3, 0)} more): "
            "it was saved from another architecture"
        )
    if torch_opt is not None and not info.get("has_optimizer"):
        raise ValueError(f"sharded checkpoint {str(path)!r} holds no optimizer state (saved with optimizer=None)")
    with _resident(owner):  # loaded on the parameters' devices, offloaded again after (optim.offload)
        if torch_opt is not None and any(k.startswith("optim.") for k in stored):  # else saved before the first step
            state["optim"] = get_optimizer_state_dict(model, torch_opt)  # initialises a fresh optimizer's state
        if owner is not None and "schedule.skipped_steps" in stored:
            state["schedule"] = {"scheduler": owner.scheduler.state_dict(), "skipped_steps": 0}
        with _dcp_quiet():
            dcp.load(state, checkpoint_id=str(path), process_group=process_group, no_dist=not _distributed())
        set_model_state_dict(model, state["model"])
        if "optim" in state:
            set_optimizer_state_dict(model, torch_opt, state["optim"])
        if "schedule" in state:
            owner.scheduler.load_state_dict(state["schedule"]["scheduler"])
            owner.skipped_steps = int(state["schedule"]["skipped_steps"])
    _barrier(process_group)


def _meta_model(model_config_dir: Path):
    """The architecture of ``model_config_dir`` built on the meta device (no memory): its config and model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return config, model


def export_hf(
    sharded_path: str | Path,
    out_dir: str | Path,
    *,
    model_config_dir: str | Path,
    dtype: str | None = None,
    max_shard_size: str = "5GB",
) -> Path:
    """Consolidate a sharded checkpoint into a Hugging Face model folder; runs in one process (no group needed).

    The folder holds ``model*.safetensors`` (tied weights stored once), ``config.json`` and every non-weight
    file of ``model_config_dir`` (tokenizer, chat template, generation config), so
    ``load_model(out_dir)``, ``AutoModelForCausalLM.from_pretrained(out_dir)`` and ``drmas eval --model out_dir``
    load it. It is written into a temporary folder next to ``out_dir`` and renamed into place. The whole model
    is read into this process's memory once (7B in bf16: about 15 GB).

    Args:
        sharded_path: a checkpoint from :func:`save_sharded`.
        out_dir: the folder to create (must not exist).
        model_config_dir: a Hugging Face folder with the model's ``config.json`` and its tokenizer (for example
            the one the worker group loaded the model from).
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` to cast the weights to; None keeps the stored dtype.
        max_shard_size: safetensors shard size (``huggingface_hub.save_torch_state_dict``).

    Returns:
        ``out_dir`` as a Path.

    Raises:
        FileNotFoundError: no complete checkpoint at ``sharded_path``, or no ``config.json`` in ``model_config_dir``.
        FileExistsError: ``out_dir`` exists (never overwritten).
        ValueError: the checkpoint's weights do not match the architecture of ``model_config_dir`` (missing,
            unexpected or differently shaped tensors), a LoRA (PEFT) checkpoint, or an unknown ``dtype``.
    """
    from huggingface_hub import save_torch_state_dict

    src, out, cfg_dir = Path(sharded_path), Path(out_dir), Path(model_config_dir)
    _require_checkpoint(src)
    if out.exists():
        raise FileExistsError(f"export target {str(out)!r} exists; choose a new folder (it is never overwritten)")
    if not (cfg_dir / "config.json").is_file():
        raise FileNotFoundError(f"model_config_dir {str(cfg_dir)!r} has no config.json (a Hugging Face model folder)")
    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or None, got {dtype!r}")
    stored = {k[len("model.") :]: m for k, m in _stored_keys(src).items() if k.startswith("model.")}
    if any("lora_" in k or k.startswith("base_model.model.") for k in stored):
        raise ValueError(f"{str(src)!r} is a LoRA (PEFT) checkpoint; export_hf writes full models only")
    config, meta = _meta_model(cfg_dir)
    expected = meta.state_dict()
    tied = {k for k in expected if k.endswith("lm_head.weight")} if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(stored) - tied)
    unexpected = sorted(set(stored) - set(expected))
    reshaped = sorted(k for k in set(stored) & set(expected) if tuple(stored[k].size) != tuple(expected[k].shape))
    if missing or unexpected or reshaped:
        raise ValueError(
            f"checkpoint {str(src)!r} does not match the {type(meta).__name__} of {str(cfg_dir)!r}: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}, other shape {reshaped[:3]}"
        )
    weights = {k: torch.empty(tuple(m.size), dtype=m.properties.dtype) for k, m in stored.items() if k not in tied}
    with _dcp_quiet():
        dcp.load({"model": weights}, checkpoint_id=str(src), no_dist=True)
    if dtype is not None:
        weights = {k: v.to(_DTYPES[dtype]) for k, v in weights.items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        for f in cfg_dir.iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
                shutil.copy2(f, tmp / f.name)
        config.dtype = next(iter(weights.values())).dtype if weights else config.dtype
        config.save_pretrained(tmp)  # config.json with the exported dtype
        save_torch_state_dict(weights, tmp, max_shard_size=max_shard_size)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def import_hf(hf_dir: str | Path, model: torch.nn.Module, *, process_group: Any = None) -> None:
    """Load a Hugging Face folder's safetensors weights into ``model`` (FSDP2, DDP or plain); collective.

    Under ``torch.distributed``, rank 0 of the default group reads the files and broadcasts each tensor; every
    rank keeps its own shard (``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)``). With no
    process group the files are read directly (:func:`drmas_train.model.weights.load_weights`). Tied output
    embeddings absent from the files are fine.

    Args:
        hf_dir: a folder with ``*.safetensors`` (``save_pretrained`` or :func:`export_hf` output).
        model: the model to fill, same architecture.
        process_group: the group to synchronise at the end (the broadcast uses the model's own device mesh).

    Raises:
        FileNotFoundError: no ``*.safetensors`` in ``hf_dir``.
        RuntimeError: the files lack weights of ``model`` (other than tied output embeddings).
    """
    folder = Path(hf_dir)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(folder)!r}")
    if not _distributed():
        load_weights(_unwrapped(model), folder)
        return
    full: dict[str, torch.Tensor] = {}
    if dist.get_rank() == 0:
        from safetensors.torch import load_file

        for f in files:
            full.update(load_file(f))
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    result = set_model_state_dict(model, full, options=options)
    missing = [k for k in result.missing_keys if not k.endswith("lm_head.weight")]
    if missing:
        raise RuntimeError(f"{str(folder)!r} lacks weights for {missing[:5]} (+{max(len(missing) - 5, 0)} more)")
    _barrier(process_group)
