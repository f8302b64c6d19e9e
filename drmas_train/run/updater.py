"""The updater seam: who runs the PPO update of each trainable model (and of PPO's critics), and writes / reads
their training state.

:class:`LocalUpdater` is the single-process path (the default): :func:`drmas_train.algorithm.update.ppo_update` on the
driver's own models, then ``backend.sync_weights``. :class:`drmas_train.distributed.updater.RayUpdater` has the
same methods and runs the update on each model's Ray worker group. Both take the run's
:class:`~drmas_train.algorithm.settings.UpdateSettings` whole. The trainer only calls::

    updater.world_size(model_id)                           # ranks that train a model (batch padding)
    updater.start_iteration(iteration)                     # what the run is doing (fault messages)
    updater.critic_keys                                    # agent_id -> critic_id of PPO's critics ({}: none)
    values = updater.critic_values(samples)                # PPO with a critic: V_t of every response token
    logprobs, ref = updater.kl_logprobs(samples)           # the KL in the reward: pi_old and pi_ref per token
    metrics = updater.update_critics(samples, values, returns, seed)   # {"critic/<critic_id>/<metric>": ...}
    metrics = updater.update(samples, advantages, seed)    # {"loss/<model_id>/<metric>": value, ...}
    updater.resume_generation()                            # or this, in an iteration without a policy update
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
from drmas_train.algorithm.critic import critic_of, critic_values, value_update
from drmas_train.algorithm.gae import pad_rows
from drmas_train.algorithm.old_logprobs import old_logprobs_for_update, recompute_old_logprobs
from drmas_train.algorithm.settings import UpdateSettings
from drmas_train.algorithm.update import ppo_update, reuses_update_forward
from drmas_train.model.adapters import activate
from drmas_train.model.adapters import load as load_adapter
from drmas_train.model.adapters import save as save_adapter
from drmas_train.run.checkpoint import (
    load_critic_states,
    load_model_states,
    save_critic_states,
    save_model_states,
)

__all__ = ["LocalUpdater"]


class LocalUpdater:
    """PPO updates in this process, one :class:`~drmas_train.algorithm.optim.ModelOptimizer` per trainable model.

    Args:
        settings: the run's update settings. pool: the :class:`~drmas_train.model.assignment.ModelPool`.
        optimizers: ``model_id -> ModelOptimizer`` (trainable models only). ref_models: ``model_id -> frozen
        reference`` (only when ``algorithm.kl_coef > 0`` or ``algorithm.reward_kl_coef > 0``).
        critics: ``critic_id -> (ValueModel, ModelOptimizer)`` (PPO with a critic; none by default).
        critic_keys: ``agent_id -> critic_id`` (:func:`drmas_train.algorithm.critic.critic_keys`).
    """

    def __init__(self, settings: UpdateSettings, pool: Any, optimizers: dict[str, Any], ref_models: dict[str, Any],
                 critics: dict[str, tuple[Any, Any]] | None = None, critic_keys: dict[str, str] | None = None) -> None:  # fmt: skip
        self.settings, self.pool, self.optimizers, self.ref_models = settings, pool, optimizers, ref_models
        self.critics, self.critic_keys = dict(critics or {}), dict(critic_keys or {})

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
            π_old mismatch metrics of :func:`~drmas_train.algorithm.logprob_drift.logprob_mismatch` when recomputed
            (by a separate forward, or from the update's own: ``old_logprob_reused``);
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
                loaded.model, [samples[i] for i in idx], adv[idx], self.settings, pad_token_id=pad, world_size=1
            )
            with opt.resident():  # the AdamW state on the device for the update only (optim.offload)
                out = ppo_update(loaded.model, opt, model_samples, adv[idx], self.settings, pad_token_id=pad,
                                 ref_model=self.ref_models.get(model_id), seed=seed,
                                 old_from_forward=reuses_update_forward(self.settings))  # fmt: skip
            self.pool.backends[model_id].sync_weights(loaded.model)
            metrics.update(namespaced(model_id, {**drift, **out}))
        return metrics

    def _pad(self, samples: list[Any]) -> int:
        return self.pool.models[samples[0].model_id].tokenizer.pad_token_id

    def critic_values(self, samples: list[Any]) -> list[np.ndarray]:
        """``V_t`` of every response token of every sample under its agent's critic
        (:func:`~drmas_train.algorithm.critic.critic_values`); an empty array for an agent without a critic.

        Args:
            samples: (B,) the iteration's samples.

        Returns:
            B float64 arrays (one value per response token).
        """
        out = [np.zeros(0)] * len(samples)
        for critic_id, idx in critic_of(self.critic_keys, samples).items():
            part = [samples[i] for i in idx]
            for i, v in zip(idx, critic_values(self.critics[critic_id][0], part, self.settings, pad_token_id=self._pad(part)),
                            strict=True):  # fmt: skip
                out[i] = v
        return out

    def kl_logprobs(self, samples: list[Any]) -> tuple[list[list[float]], list[list[float]]]:
        """π_old's and π_ref's log-probs of every response token, for the KL in the reward.

        π_old is recomputed with the training model when ``settings.recompute_old_logprobs`` (as the update will),
        else the rollout engine's; π_ref is the frozen reference's. A frozen model's samples get their own
        log-probs for both (no KL: the policy is its own reference).

        Returns:
            ``(logprobs, ref_logprobs)``: B rows each (``T_b`` floats).
        """
        logprobs = [list(s.old_logprobs) for s in samples]
        ref = [list(s.old_logprobs) for s in samples]
        for model_id, ref_model in self.ref_models.items():
            idx = [i for i, s in enumerate(samples) if s.model_id == model_id]
            if not idx:
                continue
            part, pad = [samples[i] for i in idx], self._pad([samples[idx[0]]])
            activate(self.pool.models[model_id])  # a LoRA adapter on a shared base: its own weights
            if self.settings.recompute_old_logprobs:
                part, _ = recompute_old_logprobs(self.pool.models[model_id].model, part, self.settings, pad_token_id=pad)
            ref_part, _ = recompute_old_logprobs(ref_model, part, self.settings, pad_token_id=pad)
            for i, s, r in zip(idx, part, ref_part, strict=True):
                logprobs[i], ref[i] = list(s.old_logprobs), list(r.old_logprobs)
        return logprobs, ref

    def update_critics(self, samples: list[Any], old_values: list[np.ndarray], returns: list[np.ndarray],
                       seed: int) -> dict[str, float]:  # fmt: skip
        """One PPO update of every critic on the samples it scores
        (:func:`~drmas_train.algorithm.critic.value_update`).

        Args:
            samples: (B,) the iteration's samples. old_values: B rows, :meth:`critic_values`' output. returns: B
                rows of GAE returns (one per response token). seed: the iteration seed.

        Returns:
            ``critic/<critic_id>/<metric>`` for every metric of ``value_update``.
        """
        metrics = {}
        for critic_id, idx in critic_of(self.critic_keys, samples).items():
            model, opt = self.critics[critic_id]
            part = [samples[i] for i in idx]
            old, _ = pad_rows([old_values[i] for i in idx])
            ret, _ = pad_rows([returns[i] for i in idx], old.shape[1])
            with opt.resident():
                out = value_update(model, opt, part, old, ret, self.settings, pad_token_id=self._pad(part), seed=seed)
            metrics.update({f"critic/{critic_id}/{k}": v for k, v in out.items()})
        return metrics

    def resume_generation(self) -> None:
        """Nothing to wake in-process (after an iteration without a policy update)."""

    def _adapters(self) -> list[str]:
        """Trainable model ids that are LoRA adapters on a shared base."""
        return [mid for mid in self.optimizers if self.pool.models[mid].spec.adapter is not None]

    def write_state(self, folder: Path) -> None:
        """The trainable models' weights, tokenizers and optimizer states into a checkpoint folder
        (:func:`drmas_train.run.checkpoint.save_model_states`); a LoRA adapter on a shared base as
        ``models/<key>/<adapter>/`` (:func:`drmas_train.model.adapters.save`); the critics'
        (:func:`~drmas_train.run.checkpoint.save_critic_states`)."""
        adapters = self._adapters()
        models = {mid: (self.pool.models[mid].model, self.pool.models[mid].tokenizer) for mid in self.optimizers
                  if mid not in adapters}  # fmt: skip
        save_model_states(folder, models, self.optimizers)
        for mid in adapters:
            save_adapter(self.pool.models[mid], Path(folder) / "models")
        save_critic_states(folder, self.critics)

    def read_state(self, folder: Path) -> None:
        """Inverse of :meth:`write_state`; pushes the weights to the backends.

        Raises:
            FileNotFoundError: a model, optimizer or critic of this run is absent from the checkpoint.
        """
        adapters = self._adapters()
        for mid in adapters:
            load_adapter(self.pool.models[mid], Path(folder) / "models")
        load_model_states(folder, {mid: self.pool.models[mid].model for mid in self.optimizers if mid not in adapters},
                          self.optimizers)  # fmt: skip
        load_critic_states(folder, self.critics)
        for mid, loaded in self.pool.models.items():
            self.pool.backends[mid].sync_weights(loaded.model)

    def recover(self, err: Exception, checkpoint: Path | None) -> None:
        """Nothing to recover in-process: re-raises ``err``."""
        raise err

    def close(self) -> None:
        """Nothing to release in-process."""
