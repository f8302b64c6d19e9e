"""The updater seam: who runs the PPO update of each trainable model, and writes / reads its training state.

:class:`LocalUpdater` is the single-process path (the default): :func:`drmas_train.algorithm.update.ppo_update` on the
driver's own models, then ``backend.sync_weights``. :class:`drmas_train.distributed.updater.RayUpdater` has the
same methods and runs the update on each model's Ray worker group. Both take the run's
:class:`~drmas_train.algorithm.settings.UpdateSettings` whole. The trainer only calls::

    updater.world_size(model_id)                           # ranks that train a model (batch padding)
    updater.start_iteration(iteration)                     # what the run is doing (fault messages)
    metrics = updater.update(samples, advantages, seed)    # {"loss/<model_id>/<metric>": value, ...}
    updater.write_state(folder)                            # the models' part of a checkpoint (run/checkpoint.py)
    updater.read_state(folder)                             # --resume, or a rewind after a lost training rank
    updater.recover(err, checkpoint)                       # after a DistributedError from update: rebuild or raise
    updater.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.algorithm.agent_grads import namespaced
from drmas_train.algorithm.old_logprobs import old_logprobs_for_update
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import ppo_update
from drmas_train.model.adapters import activate
from drmas_train.model.adapters import load as load_adapter
from drmas_train.model.adapters import save as save_adapter
from drmas_train.run.checkpoint import load_model_states, save_model_states

__all__ = ["LocalUpdater"]


class LocalUpdater:
    """PPO updates in this process, one :class:`~drmas_train.algorithm.optim.ModelOptimizer` per trainable model.

    Args:
        settings: the run's update settings. pool: the :class:`~drmas_train.model.assignment.ModelPool`.
        optimizers: ``model_id -> ModelOptimizer`` (trainable models only). ref_models: ``model_id -> frozen
        reference`` (only when ``algorithm.kl_coef > 0``).
    """

    def __init__(self, settings: UpdateSettings, pool: Any, optimizers: dict[str, Any], ref_models: dict[str, Any]) -> None:
        self.settings, self.pool, self.optimizers, self.ref_models = settings, pool, optimizers, ref_models

    @property
    def model_ids(self) -> list[str]:
        """Trainable model ids."""
        return list(self.optimizers)

    def world_size(self, model_id: str) -> int:
        """Ranks that train ``model_id``: one, this process."""
        return 1

    def start_iteration(self, iteration: int) -> None:
        """Nothing to tell in-process."""

    def update(self, samples: list[Any], adv: np.ndarray, seed: int) -> dict[str, float]:
        """One PPO update per trainable model on its own agents' samples; pushes the new weights to the backend.

        Args:
            samples: (B,) the iteration's samples. adv: (B,) float64 advantages. seed: the iteration seed.

        Returns:
            ``loss/<model_id>/<metric>`` for every metric of :func:`~drmas_train.algorithm.update.ppo_update`, plus the
            π_old mismatch metrics of :func:`~drmas_train.algorithm.old_logprobs.logprob_mismatch` when recomputed;
            the per-agent ones (``agent/<agent>/<metric>``: gradient split, log-prob gap) under their own names
            (:func:`~drmas_train.algorithm.agent_grads.namespaced`).
        """
        metrics = {}
        for model_id, opt in self.optimizers.items():
            idx = [i for i, s in enumerate(samples) if s.model_id == model_id]
            loaded = self.pool.models[model_id]
            activate(loaded)  # a LoRA adapter on a shared base: its weights, and only its, take gradients
            pad = loaded.tokenizer.pad_token_id
            model_samples, drift = old_logprobs_for_update(  # π_old from the training model, as the reference
                loaded.model, [samples[i] for i in idx], adv[idx], self.settings, pad_token_id=pad
            )
            out = ppo_update(loaded.model, opt, model_samples, adv[idx], self.settings, pad_token_id=pad,
                             ref_model=self.ref_models.get(model_id), seed=seed)  # fmt: skip
            self.pool.backends[model_id].sync_weights(loaded.model)
            metrics.update(namespaced(model_id, {**drift, **out}))
        return metrics

    def _adapters(self) -> list[str]:
        """Trainable model ids that are LoRA adapters on a shared base."""
        return [mid for mid in self.optimizers if self.pool.models[mid].spec.adapter is not None]

    def write_state(self, folder: Path) -> None:
        """The trainable models' weights, tokenizers and optimizer states into a checkpoint folder
        (:func:`drmas_train.run.checkpoint.save_model_states`); a LoRA adapter on a shared base as
        ``models/<key>/<adapter>/`` (:func:`drmas_train.model.adapters.save`)."""
        adapters = self._adapters()
        models = {mid: (self.pool.models[mid].model, self.pool.models[mid].tokenizer) for mid in self.optimizers
                  if mid not in adapters}  # fmt: skip
        save_model_states(folder, models, self.optimizers)
        for mid in adapters:
            save_adapter(self.pool.models[mid], Path(folder) / "models")

    def read_state(self, folder: Path) -> None:
        """Inverse of :meth:`write_state`; pushes the weights to the backends.

        Raises:
            FileNotFoundError: a model or optimizer of this run is absent from the checkpoint.
        """
        adapters = self._adapters()
        for mid in adapters:
            load_adapter(self.pool.models[mid], Path(folder) / "models")
        load_model_states(folder, {mid: self.pool.models[mid].model for mid in self.optimizers if mid not in adapters},
                          self.optimizers)  # fmt: skip
        for mid, loaded in self.pool.models.items():
            self.pool.backends[mid].sync_weights(loaded.model)

    def recover(self, err: Exception, checkpoint: Path | None) -> None:
        """Nothing to recover in-process: re-raises ``err``."""
        raise err

    def close(self) -> None:
        """Nothing to release in-process."""
