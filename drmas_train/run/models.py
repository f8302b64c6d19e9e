"""The run's models from its config: each agent's :class:`~drmas_train.model.models.ModelSpec` (:func:`model_specs`)
and the generation engine of each loaded model (:func:`backend_factory`)."""

from __future__ import annotations

from typing import Any

from drmas_train.run.config import TrainConfig

__all__ = ["model_specs", "backend_factory"]


def _peft_lora(lora: Any) -> dict[str, Any] | None:
    """PEFT ``LoraConfig`` keyword arguments of a ``models.<key>.lora`` (or adapter) section."""
    if lora is None:
        return None
    return {"r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout, "target_modules": list(lora.target_modules)}


def model_specs(cfg: TrainConfig) -> dict[str, Any]:
    """``agent_id -> ModelSpec`` for :func:`drmas_train.backends.factory.build_models`; the config key is the model id,
    so agents naming the same key share one model and different keys never do. An agent naming ``<key>:<adapter>``
    gets that LoRA adapter of the key's base (model id ``<key>:<adapter>``; the base is loaded once for all its
    adapters). A model of a dtype below float32 gets float32 master weights (``optim.master_dtype: float32``;
    :meth:`~drmas_train.model.models.ModelSpec.holds_masters` says which models keep them)."""
    from drmas_train.model.adapters import split_model_id
    from drmas_train.model.models import ModelSpec

    specs = {}
    for agent, name in cfg.agents.items():
        key, adapter = split_model_id(name)
        m = cfg.models[key]
        lora = _peft_lora(m.adapters[adapter] if adapter is not None else m.lora)
        overrides = {k: v for k, v in (("lr", m.lr), ("weight_decay", m.weight_decay)) if v is not None}
        master = "float32" if cfg.optim.master_dtype == "float32" and m.dtype != "float32" else None
        specs[agent] = ModelSpec(
            m.name_or_path, dtype=m.dtype, device=m.device, trainable=m.trainable, lora=lora, optimizer=overrides,
            seed=cfg.seed, chat_template_kwargs=dict(m.chat_template_kwargs), model_id=name, adapter=adapter,
            master_dtype=master,
        )  # fmt: skip
    return specs


def backend_factory(cfg: TrainConfig) -> Any:
    """``loaded -> backend``: each model's engine (``models.<key>.backend``) seeded with the run's seed; the HF engine
    decodes float32 models in ``rollout.autocast``'s dtype."""
    from drmas_train.backends.factory import make_backend
    from drmas_train.model.adapters import split_model_id

    def make(loaded: Any) -> Any:
        kind = cfg.models[split_model_id(loaded.model_id)[0]].backend
        return make_backend(loaded, kind, seed=cfg.seed, **({"autocast": cfg.rollout.autocast} if kind == "hf" else {}))

    return make
