"""Rank bodies for the sharded-checkpoint tests, run by ``torch.multiprocessing.spawn`` on 2 gloo ranks (CPU).

They live in their own module so that spawned processes can import them. Each rank writes what the test must
check into ``<tmp>/rank<r>.pt``; the test process makes the assertions.

Scenario (tiny-llama, AdamW with warm-up so the LR schedule matters, a different token batch per rank):

* FSDP2 on 2 ranks: step on batch 0, record the full state (weights, optimizer) and logits, ``save_sharded``,
  step on batch 1, record the full state again (the uninterrupted run); rank 0 runs ``export_hf``.
* Fresh model and optimizer objects (initialised differently, seed 1), FSDP2, ``load_sharded``: record the full
  state (must equal the saved one), step on batch 1, record (must equal the uninterrupted run); then a DDP
  model loads the same checkpoint (another wrapping), and a third FSDP2 model is filled from the exported
  Hugging Face folder with ``import_hf``.

One spawn serves every assertion: each process start costs several seconds of imports on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

LR = 1e-2
WARMUP = 2


def batch(rank: int, step: int, vocab: int, rows: int = 2, length: int = 12) -> torch.Tensor:
    """(rows, length) int64 token ids, fixed by (rank, step)."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(5, vocab, (rows, length), generator=g)


def probe(vocab: int) -> torch.Tensor:
    """(1, 10) int64 fixed input whose logits compare models."""
    return torch.arange(10).remainder(vocab - 5).add(5).unsqueeze(0)


def build(strategy: str, seed: int):
    """tiny-llama wrapped per ``strategy`` (fsdp2 | ddp) and its ModelOptimizer."""
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.model.models import load_model

    model = load_model({"name_or_path": "tiny-llama", "seed": seed}).model
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
    return model, build_optimizer("m", model, lr=LR, warmup_steps=WARMUP)


def step(model, opt, rank: int, k: int, vocab: int) -> float:
    """One optimizer step on this rank's batch ``k`` (next-token loss); returns the pre-clip grad norm."""
    x = batch(rank, k, vocab)
    model.train()
    model(input_ids=x, labels=x).loss.backward()
    return opt.step()[0]


def full_state(model, opt) -> dict:
    """Unsharded weights, optimizer state and LR-schedule state (every rank gets them; CPU tensors)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    state = {"model": {k: v.detach().clone() for k, v in get_model_state_dict(model, options=options).items()}}
    if opt is not None:
        state["optim"] = get_optimizer_state_dict(model, opt.optimizer, options=options)
        state["schedule"] = {"last_epoch": opt.scheduler.last_epoch, "lr": opt.lr}
    return state


def logits(model, vocab: int) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=probe(vocab)).logits.float()


def _refuse_rename(src, dst):
    raise OSError(f"cannot rename {src} (simulated)")


def run(rank: int, world_size: int, tmp: str) -> None:
    """Entry point for ``torch.multiprocessing.spawn(run, args=(world_size, tmp))``; ``tmp/config`` must hold
    tiny-llama's Hugging Face config and tokenizer (for the export)."""
    from drmas_train.distributed.checkpoint import export_hf, import_hf, load_sharded, save_sharded

    torch.set_num_threads(1)
    tmp_path = Path(tmp)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=rank, world_size=world_size)
    out: dict = {}
    try:
        # the run that gets checkpointed
        model, opt = build("fsdp2", seed=0)
        vocab = model.config.vocab_size
        step(model, opt, rank, 0, vocab)
        out["saved"] = full_state(model, opt)
        out["logits"] = logits(model, vocab)
        save_sharded(model, opt, tmp_path / "ckpt")
        step(model, opt, rank, 1, vocab)
        out["uninterrupted"] = full_state(model, opt)
        if rank == 0:  # one process consolidates, while the group is up
            export_hf(tmp_path / "ckpt", tmp_path / "hf", model_config_dir=tmp_path / "config")
        dist.barrier()
        del model, opt
        # new models and optimizers: resume from the checkpoint
        model, opt = build("fsdp2", seed=1)
        out["fresh"] = full_state(model, None)
        load_sharded(model, opt, tmp_path / "ckpt")
        out["loaded"] = full_state(model, opt)
        step(model, opt, rank, 1, vocab)
        out["resumed"] = full_state(model, opt)
        ddp, _ = build("ddp", seed=2)
        load_sharded(ddp, None, tmp_path / "ckpt")
        out["ddp_loaded"] = full_state(ddp, None)
        save_sharded(ddp, None, tmp_path / "ckpt_ddp")  # replicas: DCP writes each tensor once
        imported, _ = build("fsdp2", seed=3)
        import_hf(tmp_path / "hf", imported)
        out["imported"] = full_state(imported, None)
        out["imported_logits"] = logits(imported, vocab)
        # rank 0 fails to publish a checkpoint: every rank raises, none waits forever
        import types

        import drmas_train.distributed.checkpoint as ckpt_mod

        real_os = ckpt_mod.os
        if rank == 0:
            ckpt_mod.os = types.SimpleNamespace(rename=_refuse_rename)
        try:
            save_sharded(model, opt, tmp_path / "refused")
        except Exception as err:  # the test asserts the type and message
            out["publish_error"] = f"{type(err).__name__}: {err}"
        finally:
            ckpt_mod.os = real_os
        torch.save(out, tmp_path / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
