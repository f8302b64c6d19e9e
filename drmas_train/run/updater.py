"""The updater seam: who runs the PPO update of each trainable model and saves / restores its training state.

:class:`LocalUpdater` is the single-process path (the default): :func:`drmas_train.algorithm.update.ppo_update` on the
driver's own models, then ``backend.sync_weights``. :class:`drmas_train.distributed.updater.RayUpdater` has the
same three methods and runs the update on each model's Ray worker group. The trainer only calls::

    metrics = updater.update(samples, advantages, seed)    # {"loss/<model_id>/<metric>": value}
    path = updater.save(ckpt_root, iteration, sampler_state=..., config_yaml=..., keep=...)
    state = updater.load(checkpoint_dir)                    # {"iteration", "sampler", "rng", "extra"}
    state = updater.recover(err)    # after a DistributedError from update: restored state to rewind to, or raise
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.run.config import TrainConfig

__all__ = ["LocalUpdater", "loss_config", "update_kwargs", "for_device"]


def loss_config(cfg: TrainConfig) -> Any:
    """The :class:`drmas_train.algorithm.losses.PolicyLossConfig` of ``cfg.algorithm``."""
    from drmas_train.algorithm.losses import PolicyLossConfig

    a = cfg.algorithm
    return PolicyLossConfig(a.clip_low, a.clip_high, a.dual_clip_c, a.loss_agg, a.kl_coef, a.kl_estimator, a.entropy_coef)


def update_kwargs(cfg: TrainConfig) -> dict[str, Any]:
    """Keyword arguments of :func:`drmas_train.algorithm.update.ppo_update` that come from the config alone."""
    a = cfg.algorithm
    return {"loss_cfg": loss_config(cfg), "temperature": cfg.rollout.temperature, "ppo_epochs": a.ppo_epochs,
            "mini_batches": a.mini_batches, "micro_batch_tokens": cfg.optim.micro_batch_tokens,
            "activation_checkpointing": cfg.optim.activation_checkpointing, "autocast": cfg.optim.autocast}  # fmt: skip


def for_device(kwargs: dict[str, Any], device: Any) -> dict[str, Any]:
    """:func:`update_kwargs` for a model on ``device``: the ``autocast`` mode (``optim.autocast``) becomes
    ``ppo_update``'s ``autocast_dtype`` (:func:`drmas_train.algorithm.precision.resolve_autocast`)."""
    from drmas_train.algorithm.precision import resolve_autocast

    out = dict(kwargs)
    out["autocast_dtype"] = resolve_autocast(out.pop("autocast", "off"), device)
    return out


class LocalUpdater:
    """PPO updates in this process, one :class:`~drmas_train.algorithm.optim.ModelOptimizer` per trainable model.

    Args:
        cfg: the run's config. pool: the :class:`~drmas_train.model.assignment.ModelPool`.
        optimizers: ``model_id -> ModelOptimizer`` (trainable models only). ref_models: ``model_id -> frozen
        reference`` (only when ``algorithm.kl_coef > 0``).
    """

    def __init__(self, cfg: TrainConfig, pool: Any, optimizers: dict[str, Any], ref_models: dict[str, Any]) -> None:
        self.cfg, self.pool, self.optimizers, self.ref_models = cfg, pool, optimizers, ref_models

    @property
    def model_ids(self) -> list[str]:
        """Trainable model ids."""
        return list(self.optimizers)

    def update(self, samples: list[Any], adv: np.ndarray, seed: int) -> dict[str, float]:
        """One PPO update per trainable model on its own agents' samples; pushes the new weights to the backend.

        Args:
            samples: (B,) the iteration's samples. adv: (B,) float64 advantages. seed: the iteration seed.

        Returns:
            ``loss/<model_id>/<metric>`` for every metric of :func:`~drmas_train.algorithm.update.ppo_update`, plus the
            π_old mismatch metrics of :func:`~drmas_train.algorithm.old_logprobs.logprob_mismatch` when recomputed.
        """
        from drmas_train.algorithm.old_logprobs import old_logprobs_for_update
        from drmas_train.algorithm.update import ppo_update

        metrics, kwargs = {}, update_kwargs(self.cfg)
        for model_id, opt in self.optimizers.items():
            idx = [i for i, s in enumerate(samples) if s.model_id == model_id]
            loaded = self.pool.models[model_id]
            pad, dev_kwargs = loaded.tokenizer.pad_token_id, for_device(kwargs, next(loaded.model.parameters()).device)
            model_samples, drift = old_logprobs_for_update(  # π_old from the training model, as the reference
                loaded.model, [samples[i] for i in idx], adv[idx], recompute=self.cfg.algorithm.recompute_old_logprobs,
                pad_token_id=pad, update_kwargs=dev_kwargs,
            )  # fmt: skip
            out = ppo_update(loaded.model, opt, model_samples, adv[idx], pad_token_id=pad,
                             ref_model=self.ref_models.get(model_id), seed=seed, **dev_kwargs)  # fmt: skip
            self.pool.backends[model_id].sync_weights(loaded.model)
            metrics.update({f"loss/{model_id}/{k}": v for k, v in {**drift, **out}.items()})
        return metrics

    def save(self, ckpt_root: Path, iteration: int, *, sampler_state: dict[str, Any], config_yaml: str, keep: int,
             extra: dict[str, Any] | None = None) -> Path:
        """An atomic checkpoint (:func:`drmas_train.run.checkpoint.save_checkpoint`) of the trainable models."""
        from drmas_train.run.checkpoint import save_checkpoint

        models = {mid: (self.pool.models[mid].model, self.pool.models[mid].tokenizer) for mid in self.optimizers}
        return save_checkpoint(ckpt_root, iteration, models=models, optimizers=self.optimizers,
                               sampler_state=sampler_state, config_yaml=config_yaml, keep=keep, extra=extra)  # fmt: skip

    def load(self, path: Path) -> dict[str, Any]:
        """Restore weights, optimizers and RNG states from ``path``; pushes the weights to the backends."""
        from drmas_train.run.checkpoint import load_checkpoint

        models = {mid: self.pool.models[mid].model for mid in self.optimizers}
        state = load_checkpoint(path, models=models, optimizers=self.optimizers)
        for mid, loaded in self.pool.models.items():
            self.pool.backends[mid].sync_weights(loaded.model)
        return state

    def recover(self, err: Exception) -> dict[str, Any]:
        """Nothing to recover in-process: re-raises ``err``."""
        raise err

    def close(self) -> None:
        """Nothing to release in-process."""
