"""The optimizer's keyword arguments are assembled in one place per optimizer: a trained model's by
``OptimConfig.optimizer_kwargs`` (its ``models.<key>.optimizer`` overriding lr and weight decay), a critic's by
``CriticConfig.optimizer_kwargs`` (the policy optimizer's betas and offload)."""

from __future__ import annotations

import torch

from drmas_train.algorithm.config import CriticConfig, OptimConfig
from drmas_train.algorithm.optim import build_optimizer


def test_a_models_optimizer_kwargs_are_the_section_with_its_own_lr_and_weight_decay():
    optim = OptimConfig(lr=2e-6, weight_decay=0.05, betas=[0.8, 0.9], warmup_steps=3, grad_clip=0.5, offload=True)
    base = {"lr": 2e-6, "weight_decay": 0.05, "betas": [0.8, 0.9], "warmup_steps": 3, "grad_clip": 0.5, "offload": True}
    assert optim.optimizer_kwargs() == optim.optimizer_kwargs({}) == base
    assert optim.optimizer_kwargs({"lr": 1e-5}) == base | {"lr": 1e-5}
    assert optim.optimizer_kwargs({"weight_decay": 0.0, "lr": 3e-6}) == base | {"lr": 3e-6, "weight_decay": 0.0}
    assert OptimConfig().optimizer_kwargs() == {"lr": 1e-6, "weight_decay": 0.01, "betas": [0.9, 0.999],
                                                "warmup_steps": 0, "grad_clip": 1.0, "offload": False}  # fmt: skip


def test_a_critics_optimizer_kwargs_share_the_policys_betas_and_offload():
    critic = CriticConfig(lr=1e-3, weight_decay=0.1, warmup_steps=2, grad_clip=2.0)
    assert critic.optimizer_kwargs(betas=[0.5, 0.6], offload=False) == {
        "lr": 1e-3, "weight_decay": 0.1, "betas": [0.5, 0.6], "warmup_steps": 2, "grad_clip": 2.0, "offload": False}  # fmt: skip


def test_the_kwargs_build_the_optimizer_they_describe():
    model = torch.nn.Linear(3, 2)
    opt = build_optimizer("m", model, **OptimConfig(betas=[0.8, 0.9], grad_clip=0.5).optimizer_kwargs({"lr": 1e-4}))
    group = opt.optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], group["betas"], opt.grad_clip) == (1e-4, 0.01, (0.8, 0.9), 0.5)
    critic = build_optimizer("critic/m", model, **CriticConfig(lr=1e-3, grad_clip=2.0).optimizer_kwargs(
        betas=[0.7, 0.8], offload=False))  # what build_critic builds
    group = critic.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], critic.grad_clip) == (1e-3, (0.7, 0.8), 2.0)
