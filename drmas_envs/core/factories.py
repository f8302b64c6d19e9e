"""PettingZoo-style module factories: every env module exports ``raw_env``, ``env`` and ``parallel_env``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["make_factories"]


def make_factories(raw_env: type) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``env`` (``raw_env`` in PettingZoo's ``OrderEnforcingWrapper``) and ``parallel_env`` factories.

    ``parallel_env`` is ``pettingzoo.utils.conversions.turn_based_aec_to_parallel`` over ``env``. Both carry
    ``raw_env``'s signature, so the registry can name an unknown keyword argument.
    """
    from pettingzoo.utils import wrappers
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    def env(**kwargs: Any) -> Any:
        return wrappers.OrderEnforcingWrapper(raw_env(**kwargs))

    def parallel_env(**kwargs: Any) -> Any:
        return turn_based_aec_to_parallel(env(**kwargs))

    for factory, what in ((env, "wrapped in OrderEnforcingWrapper"), (parallel_env, "as a parallel env")):
        factory.__signature__ = inspect.signature(raw_env)  # type: ignore[attr-defined]
        factory.__doc__ = f"``{raw_env.__name__}(**kwargs)`` {what} (PettingZoo convention)."
        factory.__module__ = raw_env.__module__
    return env, parallel_env
