"""Agent -> model assignment and the model pool (Dr. MAS "LLM sharing" vs "non-sharing").

An assignment maps each env ``agent_id`` to a :class:`~drmas_train.model.models.ModelSpec` (or a name/path string).
The key ``"*"`` gives a default for every agent not listed. Agents whose specs are equal share **one** loaded
model, one set of trainable weights and one backend (sharing); ``share=False`` gives every agent its own copy
even when the specs are equal (non-sharing, the Dr. MAS ablation); different specs — possibly different
families and tokenizers — are always separate (heterogeneous).

Model ids: a shared model is named after its spec (``ModelSpec.default_id()``, e.g. ``"tiny-qwen3"``, with
``-2``, ``-3`` ... when two different specs would collide); with ``share=False`` the id is
``"<default_id>@<agent_id>"``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from drmas_train.model.models import LoadedModel, ModelSpec

__all__ = [
    "AgentAssignment",
    "ModelPool",
    "check_agents",
    "agent_mismatch",
    "AssignmentError",
]

WILDCARD = "*"


class AssignmentError(ValueError):
    """An agent -> model assignment that does not fit the env (unknown agent, agent without a model, ...)."""


def agent_mismatch(assigned: Iterable[str], env_agents: Sequence[str]) -> tuple[list[str], list[str]]:
    """Compare assigned agent ids with an env's ``possible_agents`` (the one place this comparison is made).

    Returns:
        ``(unknown, missing)``: assigned ids the env does not have (``"*"`` excluded), in assignment order, and env
        agents without a model, in env order (none when ``"*"`` gives a default).
    """
    assigned, env_agents = list(assigned), list(env_agents)
    unknown = [a for a in assigned if a != WILDCARD and a not in env_agents]
    missing = [] if WILDCARD in assigned else [a for a in env_agents if a not in assigned]
    return unknown, missing


def check_agents(assigned: Iterable[str], env_agents: Sequence[str], env_name: str = "the env") -> None:
    """Check assigned agent ids against an env's ``possible_agents`` (:func:`agent_mismatch`).

    Raises:
        AssignmentError: an assigned agent the env does not have (with the closest name), or an env agent
            without a model (when there is no ``"*"`` default).
    """
    env_agents = list(env_agents)
    unknown, missing = agent_mismatch(assigned, env_agents)
    if unknown:
        close = difflib.get_close_matches(unknown[0], env_agents, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise AssignmentError(f"unknown agent {unknown[0]!r} for {env_name}: its agents are {env_agents}{hint}")
    if missing:
        raise AssignmentError(
            f"agent(s) {missing} of {env_name} have no model; assign each agent of {env_agents} "
            f"or give a default with the key '*'"
        )


@dataclasses.dataclass(frozen=True)
class AgentAssignment:
    """Which model each agent uses, and how agents map onto model ids (no model is loaded here).

    Attributes:
        agent_specs: ``agent_id -> ModelSpec`` (``"*"`` = default for unlisted agents).
        share: agents with equal specs share one model (True) or each get their own copy (False).

    Raises:
        AssignmentError: an empty mapping or a non-string agent id.
        TypeError/ValueError: a model entry that is not a spec, a string or a dict of spec fields.
    """

    agent_specs: Mapping[str, ModelSpec]
    share: bool = True

    @classmethod
    def from_mapping(
        cls, agent_models: Mapping[str, ModelSpec | str | dict[str, Any]], *, share: bool = True
    ) -> AgentAssignment:
        """Coerce each entry with :meth:`ModelSpec.coerce`."""
        if not isinstance(agent_models, Mapping) or not agent_models:
            raise AssignmentError(
                f"agent_models must be a non-empty mapping agent_id -> model, got {agent_models!r}"
            )
        specs = {}
        for agent, value in agent_models.items():
            if not isinstance(agent, str) or not agent:
                raise AssignmentError(f"agent ids must be non-empty strings, got {agent!r}")
            if value is None:
                raise AssignmentError(
                    f"agent {agent!r} has no model (got None); give a model name, path or ModelSpec"
                )
            specs[agent] = ModelSpec.coerce(value)
        return cls(specs, share)

    def validate(self, env_agents: Sequence[str], env_name: str = "the env") -> None:
        """Check the assignment against the env's ``possible_agents``.

        Raises:
            AssignmentError: an assigned agent the env does not have (with the closest name), or an env agent
                without a model (when there is no ``"*"`` default).
        """
        check_agents(self.agent_specs, env_agents, env_name)

    def expand(self, env_agents: Sequence[str]) -> AgentAssignment:
        """Validate, then replace ``"*"`` by one explicit entry per unlisted env agent."""
        self.validate(env_agents)
        specs = {
            a: self.agent_specs[a] if a in self.agent_specs else self.agent_specs[WILDCARD]
            for a in env_agents
        }
        return AgentAssignment(specs, self.share)

    def model_ids(self) -> dict[str, str]:
        """``agent_id -> model_id`` (see the module docstring for the naming rule).

        Raises:
            AssignmentError: ``share=False`` with a ``"*"`` entry (expand it against the env first).
        """
        if not self.share:
            if WILDCARD in self.agent_specs:
                raise AssignmentError(
                    "share=False needs explicit agents: call expand(env.possible_agents) first"
                )
            return {a: f"{spec.default_id()}@{a}" for a, spec in self.agent_specs.items()}
        ids_by_key: dict[tuple, str] = {}
        taken: set[str] = set()
        out = {}
        for agent, spec in self.agent_specs.items():
            key = spec.key()
            if key not in ids_by_key:
                base, k = spec.default_id(), 1
                name = base
                while name in taken:
                    k += 1
                    name = f"{base}-{k}"
                ids_by_key[key] = name
                taken.add(name)
            out[agent] = ids_by_key[key]
        return out


@dataclasses.dataclass
class ModelPool:
    """Loaded models and their backends, keyed by model id.

    Attributes:
        models: ``model_id -> LoadedModel``.
        backends: ``model_id -> Backend`` (one per model: shared agents share it).
        agent_model_ids: ``agent_id -> model_id`` (may hold ``"*"``).
    """

    models: dict[str, LoadedModel]
    backends: dict[str, Any]
    agent_model_ids: dict[str, str]

    def model_of(self, agent_id: str) -> str:
        """Model id that plays ``agent_id``.

        Raises:
            AssignmentError: the agent has no model and there is no ``"*"`` default.
        """
        if agent_id in self.agent_model_ids:
            return self.agent_model_ids[agent_id]
        if WILDCARD in self.agent_model_ids:
            return self.agent_model_ids[WILDCARD]
        raise AssignmentError(
            f"agent {agent_id!r} has no model; assigned agents: {sorted(self.agent_model_ids)}"
        )

    def backend_of(self, agent_id: str) -> Any:
        """The backend that generates for ``agent_id``."""
        return self.backends[self.model_of(agent_id)]

    def agents_of(self, model_id: str) -> list[str]:
        """Agents (as assigned, ``"*"`` included) that ``model_id`` plays."""
        return [a for a, m in self.agent_model_ids.items() if m == model_id]

    def validate(self, env_agents: Sequence[str], env_name: str = "the env") -> None:
        """Same checks as :meth:`AgentAssignment.validate` on the loaded pool."""
        check_agents(self.agent_model_ids, env_agents, env_name)
