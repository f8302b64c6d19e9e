"""PettingZoo-style module factories: every env module exports ``raw_env``, ``env`` and ``parallel_env``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["make_factories", "complete_signature"]


def complete_signature(cls: type, base: type) -> None:
    """Give ``cls`` the full signature when its ``__init__`` forwards ``**kwargs`` to ``base.__init__``.

    ``cls.__signature__`` becomes ``cls.__init__``'s own parameters (without ``**kwargs``) followed by those
    of ``base.__init__`` that ``cls`` does not redeclare (as keyword-only). ``inspect.signature(cls)``, the
    registry's unknown-argument check and ``help()`` then list every accepted argument, while the shared ones
    are written (and checked) once, in ``base``.
    """
    own = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:] if p.kind is not p.VAR_KEYWORD]
    names = {p.name for p in own}
    shared = [
        p.replace(kind=p.KEYWORD_ONLY)
        for p in list(inspect.signature(base).parameters.values())
        if p.name not in names and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    cls.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]


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
