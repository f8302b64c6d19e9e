"""The PPO update's typed settings: what :func:`drmas_train.algorithm.update.ppo_update` needs besides its data.

Built once per run from the config (:meth:`UpdateSettings.from_config`) and passed whole to the single-process
updater, to the Ray updater and to every training rank; nobody reads update settings by string key or restates
their defaults. The config-backed fields have no default here (their one default is in
:mod:`drmas_train.algorithm.config` or :class:`drmas_train.collect.config.RolloutConfig`); the three knobs that no
config section holds (``lm_head_chunk``, ``share_prompts``, ``skip_zero_advantage``) have theirs here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from drmas_train.algorithm.advantages import needs_critic
from drmas_train.algorithm.config import AlgorithmConfig, CriticConfig, OptimConfig
from drmas_train.algorithm.losses import LOSS_FIELDS, PolicyLossConfig

__all__ = ["UpdateSettings", "CriticSettings", "loss_settings"]


def loss_settings(algorithm: AlgorithmConfig) -> PolicyLossConfig:
    """The PPO loss settings of an ``algorithm`` section."""
    return PolicyLossConfig(**{name: getattr(algorithm, name) for name in LOSS_FIELDS})


@dataclass(frozen=True)
class CriticSettings:
    """The critic's update settings besides those it shares with the policy's (epochs, mini-batches, micro-batch
    budget, autocast, loss aggregation: as the reference's critic takes the actor's).

    Attributes:
        value_clip: the value clip range (``critic.value_clip``; None = unclipped).
    """

    value_clip: float | None

    @classmethod
    def from_config(cls, critic: CriticConfig) -> CriticSettings:
        return cls(value_clip=critic.value_clip)


@dataclass(frozen=True)
class UpdateSettings:
    """Settings of one PPO update of one model (frozen; :meth:`replace` gives a changed copy).

    Attributes:
        loss: the PPO loss (clip ranges, aggregation, KL, entropy): :func:`loss_settings` of ``algorithm``.
        temperature: the rollout temperature (``rollout.temperature``): log-probs are taken at it, as sampled.
        ppo_epochs, mini_batches: passes over the samples and optimizer steps per pass (``algorithm.*``).
        mini_batch_order: ``in_order`` | ``shuffle`` (``algorithm.*``).
        loss_micro_batch_size: samples per micro-batch of the reference's loss aggregation, or None for one mean
            per mini-batch (``algorithm.*``; :mod:`drmas_train.algorithm.batch_layout`).
        micro_batch_tokens: token budget of one forward/backward, or ``"auto"`` (``optim.micro_batch_tokens``).
        activation_checkpointing: 0 = off, k = recompute every k-th decoder layer (``optim.*``).
        autocast: ``off`` | ``bf16`` | ``auto`` (``optim.autocast``), resolved for each model's device
            (:func:`drmas_train.model.precision.resolve_autocast`).
        recompute_old_logprobs: recompute π_old with the training model first (``algorithm.*``, the reference's).
        agent_grad_norms: split each step's gradient into its agents' parts (``optim.agent_grad_norms``;
            :mod:`drmas_train.algorithm.agent_grads`).
        lm_head_chunk: tokens per LM-head chunk (None = automatic, 0 = the plain full-logits path).
        share_prompts: compute each group's shared prompt once per micro-batch.
        skip_zero_advantage: skip the forward/backward of samples whose advantage is exactly 0 when no KL or
            entropy term reads them (the update is identical).
        critic: the critic's own settings (:class:`CriticSettings`) when the estimator reads values (``gae``), else
            None (the run has no critic).

    Raises:
        ConfigError: a value out of range, found by the check of its config section (``optim.*``, ``algorithm.*``;
            the loss settings check themselves), so each setting has one check.
    """

    loss: PolicyLossConfig
    temperature: float
    ppo_epochs: int
    mini_batches: int
    mini_batch_order: str
    loss_micro_batch_size: int | None
    micro_batch_tokens: int | str
    activation_checkpointing: int
    autocast: str
    recompute_old_logprobs: bool
    agent_grad_norms: bool
    lm_head_chunk: int | None = None
    share_prompts: bool = True
    skip_zero_advantage: bool = True
    critic: CriticSettings | None = None

    def __post_init__(self) -> None:  # the config sections' own checks: one check per setting
        OptimConfig(micro_batch_tokens=self.micro_batch_tokens, activation_checkpointing=self.activation_checkpointing,
                    autocast=self.autocast).validate()  # fmt: skip
        AlgorithmConfig(ppo_epochs=self.ppo_epochs, mini_batches=self.mini_batches, mini_batch_order=self.mini_batch_order,
                        loss_micro_batch_size=self.loss_micro_batch_size, batch_padding="none").validate()  # fmt: skip

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig, optim: OptimConfig, *, temperature: float,
                    critic: CriticConfig | None = None) -> UpdateSettings:  # fmt: skip
        """The settings of a run: its ``algorithm`` and ``optim`` sections, ``rollout.temperature`` and, when the
        estimator reads values, its ``critic`` section (None: the section's defaults)."""
        critic_settings = None
        if needs_critic(algorithm.estimator):
            critic_settings = CriticSettings.from_config(critic if critic is not None else CriticConfig())
        return cls(loss=loss_settings(algorithm), temperature=temperature, ppo_epochs=algorithm.ppo_epochs,
                   mini_batches=algorithm.mini_batches, mini_batch_order=algorithm.mini_batch_order,
                   loss_micro_batch_size=algorithm.loss_micro_batch_size, micro_batch_tokens=optim.micro_batch_tokens,
                   activation_checkpointing=optim.activation_checkpointing, autocast=optim.autocast,
                   recompute_old_logprobs=algorithm.recompute_old_logprobs, critic=critic_settings,
                   agent_grad_norms=optim.agent_grad_norms)  # fmt: skip

    @classmethod
    def defaults(cls, **changes: Any) -> UpdateSettings:
        """The settings of the config's defaults at temperature 1 with ``changes`` applied; a change named after
        a loss field (``loss_agg``, ``kl_coef``, ...) goes to :attr:`loss`. For tests, benchmarks and scripts."""
        return cls.from_config(AlgorithmConfig(), OptimConfig(), temperature=1.0).replace(**changes)

    def replace(self, **changes: Any) -> UpdateSettings:
        """A copy with ``changes``; loss fields (``clip_low``, ``loss_agg``, ``kl_coef``, ...) may be given directly.

        Raises:
            TypeError: a name that is neither a field of these settings nor of :class:`PolicyLossConfig`.
        """
        loss = {k: changes.pop(k) for k in list(changes) if k in LOSS_FIELDS}
        if loss:
            changes["loss"] = dataclasses.replace(changes.get("loss", self.loss), **loss)
        return dataclasses.replace(self, **changes)
