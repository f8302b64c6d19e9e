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

    Built and checked in :meth:`from_config` (or :meth:`defaults`) by the config sections' own checks, so each
    setting has one check; :meth:`replace` copies without checking again.
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

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig, optim: OptimConfig, *, temperature: float,
                    critic: CriticConfig | None = None) -> UpdateSettings:  # fmt: skip
        """The settings of a run: its ``algorithm`` and ``optim`` sections, ``rollout.temperature`` and, when the
        estimator reads values, its ``critic`` section (None: the section's defaults).

        The one place settings are built from the config, so the one place they are checked: by the sections' own
        checks (``validate``), on the sections themselves.

        Raises:
            ConfigError: a value out of range (``algorithm.*``, ``optim.*``), as the section's check words it.
        """
        algorithm.validate()
        optim.validate()
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
        """The settings of the config's defaults at temperature 1 with ``changes`` applied. A change named after a
        field of the ``algorithm`` or ``optim`` section is made in that section before :meth:`from_config`, so it
        gets the section's check; a loss field (``loss_agg``, ``kl_coef``, ...) goes to :attr:`loss`, which checks
        itself (:class:`PolicyLossConfig`, the check the algorithm section runs too); the others (``temperature``,
        ``lm_head_chunk``, ``share_prompts``, ``skip_zero_advantage``, ``critic``) are set on the settings. For tests,
        benchmarks and scripts. The algorithm section is built with ``batch_padding: none``:
        padding is the trainer's, not the update's, so its check does not apply here.

        Raises:
            ConfigError: a section's check fails. ValueError: the loss's check fails. TypeError: a name that is
                neither a section field nor a setting.
        """
        sections = {AlgorithmConfig: {"batch_padding": "none"}, OptimConfig: {}}
        for section, kwargs in sections.items():
            names = {f.name for f in dataclasses.fields(section)} - set(LOSS_FIELDS)  # the loss checks itself
            kwargs.update({k: changes.pop(k) for k in list(changes) if k in names})
        temperature = changes.pop("temperature", 1.0)
        built = cls.from_config(AlgorithmConfig(**sections[AlgorithmConfig]), OptimConfig(**sections[OptimConfig]),
                                temperature=temperature)  # fmt: skip
        return built.replace(**changes) if changes else built

    def replace(self, **changes: Any) -> UpdateSettings:
        """A copy with ``changes``, not checked again (a config value is checked where the settings are built:
        change it in its section, or through :meth:`defaults`); loss fields (``clip_low``, ``loss_agg``,
        ``kl_coef``, ...) may be given directly.

        Raises:
            TypeError: a name that is neither a field of these settings nor of :class:`PolicyLossConfig`.
        """
        loss = {k: changes.pop(k) for k in list(changes) if k in LOSS_FIELDS}
        if loss:
            changes["loss"] = dataclasses.replace(changes.get("loss", self.loss), **loss)
        return dataclasses.replace(self, **changes)
