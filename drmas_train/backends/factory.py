"""The engine factory: a generation backend over a loaded model (:func:`make_backend`), and the whole model pool of
an agent -> model assignment, each distinct model loaded once with its backend (:func:`build_models`).

It sits above :mod:`drmas_train.model` (specs, loading, the assignment and pool records) and the engines of this
package, so neither of them imports the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from drmas_train.backends.base import LOCAL_BACKENDS
from drmas_train.model import models as model_loading
from drmas_train.model.adapters import attach
from drmas_train.model.assignment import AgentAssignment, ModelPool
from drmas_train.model.models import LoadedModel, ModelSpec

__all__ = ["make_backend", "build_models"]


def make_backend(loaded: LoadedModel, kind: str = "hf", **kwargs: Any) -> Any:
    """A backend of ``kind`` (``"hf"`` or ``"vllm"``) over a loaded model.

    Raises:
        ValueError: an unknown kind.
    """
    if kind == "hf":
        from drmas_train.backends.hf import HFBackend

        return HFBackend.from_loaded(loaded, **kwargs)
    if kind == "vllm":
        from drmas_train.backends.vllm import VLLMBackend

        return VLLMBackend.from_loaded(loaded, **kwargs)
    raise ValueError(
        f"unknown backend {kind!r}; accepted: {', '.join(map(repr, LOCAL_BACKENDS))} (or pass a callable LoadedModel -> Backend)"
    )


def build_models(
    agent_models: Mapping[str, ModelSpec | str | dict[str, Any]] | AgentAssignment,
    *,
    share: bool = True,
    env_agents: Sequence[str] | None = None,
    backend: str | Callable[[LoadedModel], Any] = "hf",
    backend_kwargs: Mapping[str, Any] | None = None,
    loader: Callable[[ModelSpec, str], LoadedModel] | None = None,
) -> ModelPool:
    """Load each distinct model once and build one backend per model.

    Specs with an ``adapter`` (:class:`~drmas_train.model.models.ModelSpec`) are LoRA adapters: those with equal base
    keys share one loaded base (``loader`` is called once for it, with :meth:`ModelSpec.base_spec`), each adapter its
    own model id and backend over the shared ``PeftModel`` (:func:`drmas_train.model.adapters.attach`).

    Args:
        agent_models: ``agent_id -> model`` (spec, name/path or dict; ``"*"`` = default), or an assignment.
        share: see :class:`AgentAssignment` (ignored when an assignment is given).
        env_agents: the env's ``possible_agents``; when given the assignment is validated (and ``"*"`` expanded)
            before any model loads.
        backend: ``"hf"``, ``"vllm"`` or a callable ``LoadedModel -> Backend``.
        backend_kwargs: extra keyword arguments for the backend.
        loader: ``(spec, model_id) -> LoadedModel`` (tests inject fakes); None =
            :func:`drmas_train.model.models.load_model`, looked up at the call (a patched ``load_model`` is seen, and
            never kept beyond its patch).

    Raises:
        AssignmentError: see :meth:`AgentAssignment.validate` and :meth:`AgentAssignment.model_ids`.
    """
    assignment = (
        agent_models
        if isinstance(agent_models, AgentAssignment)
        else AgentAssignment.from_mapping(agent_models, share=share)
    )
    if env_agents is not None:
        assignment = assignment.expand(env_agents)
    ids = assignment.model_ids()
    loader = loader or model_loading.load_model
    models: dict[str, LoadedModel] = {}
    backends: dict[str, Any] = {}
    bases: dict[tuple, LoadedModel] = {}  # base key -> the base that its adapters share (drmas_train.model.adapters)
    for agent, model_id in ids.items():
        if model_id in models:
            continue
        spec = assignment.agent_specs[agent]
        if spec.adapter is not None:  # one adapter on a base loaded once
            key = spec.base_key()
            if key not in bases:
                bases[key] = loader(spec.base_spec(), model_id)
            loaded = attach(bases[key], spec, model_id)
        else:
            loaded = loader(spec, model_id)
        models[model_id] = loaded
        backends[model_id] = (
            backend(loaded)
            if callable(backend)
            else make_backend(loaded, backend, **dict(backend_kwargs or {}))
        )
    return ModelPool(models, backends, ids)
