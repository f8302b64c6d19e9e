"""Fixed-schema, numeric ``infos`` for libraries that turn infos into tensors (TorchRL, BenchMARL).

drmas infos hold strings (``role``, ``task_id``, ``data_source``) and gain keys over an episode
(``penalty`` after an agent's call, ``won``/``score`` and outcome fields at the end). TorchRL's
``PettingZooWrapper`` builds one tensor spec per info key from the *reset* infos and writes every key
with ``torch.tensor(value)`` on each step, so it needs every agent's infos to have the same keys at
every step and numeric values. :class:`NumericInfos` presents exactly that: a fixed set of fields,
each cast to the type of its default and filled with the default while the env has not reported it.
The full text infos stay available on ``env.unwrapped.infos``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pettingzoo import AECEnv
from pettingzoo.utils.wrappers import BaseWrapper

__all__ = ["DEFAULT_NUMERIC_INFO_FIELDS", "NumericInfos"]

#: Field -> default (its type is the field's type): the drmas info fields that are numbers or bools.
DEFAULT_NUMERIC_INFO_FIELDS: dict[str, bool | int | float] = {
    "is_action_valid": True,  # did the agent's last call follow its protocol
    "penalty": 0.0,  # format penalty of the agent's last call (reward units)
    "turn": 0,  # calls made in the episode before the agent's last call
    "won": False,  # set for every agent at the end of the episode
    "score": 0.0,  # episode reward R, set for every agent at the end
}


class NumericInfos(BaseWrapper):
    """AEC wrapper whose ``infos[agent]`` is always ``{field: number}`` with the same fields.

    Args:
        env: any PettingZoo AEC env (drmas envs, possibly wrapped).
        fields: field name -> default value (``bool``, ``int`` or ``float``); each reported value is cast
            to the default's type. Defaults to :data:`DEFAULT_NUMERIC_INFO_FIELDS`.

    Raises:
        ValueError: ``fields`` is empty.
        TypeError: a default is not a bool, int or float, or a reported value cannot be cast to it
            (raised when ``infos`` is read; the message names the agent and field).
    """

    def __init__(self, env: AECEnv, fields: Mapping[str, bool | int | float] | None = None) -> None:
        super().__init__(env)
        fields = dict(DEFAULT_NUMERIC_INFO_FIELDS if fields is None else fields)
        if not fields:
            raise ValueError("fields is empty: give at least one info field, e.g. {'is_action_valid': True}")
        for name, default in fields.items():
            if not isinstance(default, (bool, int, float)):
                raise TypeError(
                    f"default of info field {name!r} must be a bool, int or float, got {type(default).__name__}"
                )
        self.fields = fields

    @property
    def infos(self) -> dict[str, dict[str, bool | int | float]]:  # type: ignore[override]
        """Per agent: every field of :attr:`fields`, from the wrapped env's infos or its default."""
        return {agent: self._numeric(agent, info) for agent, info in self.env.infos.items()}

    def _numeric(self, agent: str, info: Mapping[str, Any]) -> dict[str, bool | int | float]:
        out: dict[str, bool | int | float] = {}
        for name, default in self.fields.items():
            value = info.get(name, default)
            try:
                out[name] = type(default)(value)
            except (TypeError, ValueError) as err:
                raise TypeError(
                    f"info field {name!r} of agent {agent!r} is {value!r}, which cannot be cast to "
                    f"{type(default).__name__} (the type of its default)"
                ) from err
        return out
