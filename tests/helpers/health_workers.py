"""Rank bodies for the per-agent gradient test on 2 gloo ranks (``torch.multiprocessing.spawn``, CPU, no Ray).

Per strategy (FSDP2, then DDP, on one process group), from the same tiny model: a ``dp_ppo_update`` with the
per-agent gradient split on, over samples of two agents whose micro-batches do not divide evenly over the ranks
(idle passes in some agents' parts). Rank 0 writes both ranks' metrics to ``<tmp>/health.pt``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

OPTIM = {"lr": 1e-2, "weight_decay": 0.0}
#: 24 tokens per micro-batch: each agent's part of a mini-batch is several micro-batches, an odd count for one.
BUDGET = 24


def settings():
    """The config's defaults, 2 mini-batches, :data:`BUDGET` tokens per micro-batch, drmas's layout (one token mean
    per mini-batch, independent of the number of ranks), the per-agent split on."""
    from drmas_train.algorithm.settings import UpdateSettings

    return UpdateSettings.defaults(mini_batches=2, micro_batch_tokens=BUDGET, loss_micro_batch_size=None,
                                   mini_batch_order="shuffle", agent_grad_norms=True)  # fmt: skip


def samples_and_advantages(model):
    """12 on-policy samples: agents ``solver`` (8 rows, 2 prompts) and ``verifier`` (4 rows), and advantages."""
    from drmas_train.collect.samples import Sample
    from drmas_train.model.logprobs import forward_logprobs

    rng = np.random.default_rng(0)
    prompts = [rng.integers(4, 20, int(rng.integers(3, 6))).tolist() for _ in range(3)]
    out = []
    for i in range(12):
        agent, p = ("solver", i % 2) if i < 8 else ("verifier", 2)
        r = rng.integers(4, 20, int(rng.integers(1, 5))).tolist()
        out.append(
            Sample(f"u{i % 2}", f"t{i}", agent, "m", 0, 0, prompts[p], r, [0.0] * len(r), [1] * len(r))
        )
    with torch.no_grad():
        lp, _, _ = forward_logprobs(
            model, [s.prompt_ids for s in out], [s.response_ids for s in out], pad_token_id=0
        )
    for b, s in enumerate(out):
        s.old_logprobs = lp[b, : len(s.response_ids)].tolist()
    return out, rng.normal(size=len(out))


def run(rank: int, world: int, tmp: str) -> None:
    from drmas_train.algorithm.optim import build_optimizer
    from drmas_train.distributed.data_parallel import dp_ppo_update, wrap_model
    from drmas_train.model.models import ModelSpec
    from helpers.tiny_rl import tiny_loader

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{Path(tmp) / 'store'}", rank=rank, world_size=world)
    base = tiny_loader(ModelSpec("tiny"), "m").model
    samples, adv = samples_and_advantages(base)
    record = {}
    for strategy in ("fsdp2", "ddp"):
        model = wrap_model(copy.deepcopy(base), strategy, torch.device("cpu"))
        opt = build_optimizer("m", model, **OPTIM)
        metrics = dp_ppo_update(
            model, opt, samples, adv, settings(), rank=rank, world_size=world, pad_token_id=0, seed=7
        )
        gathered: list = [None] * world
        dist.all_gather_object(gathered, metrics)
        record[strategy] = gathered
    if rank == 0:
        torch.save(record, Path(tmp) / "health.pt")
