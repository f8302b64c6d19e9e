"""``metadata["is_parallelizable"]`` of drmas envs: refuses PettingZoo's ``aec_to_parallel`` with a clear error.

PettingZoo's :func:`pettingzoo.utils.conversions.aec_to_parallel` asserts
``env.metadata.get("is_parallelizable", False)`` and then steps *every* agent once per cycle, each from the
observation it had before the cycle started (``pettingzoo/utils/conversions.py``, ``aec_to_parallel_wrapper``).
drmas envs are turn-based conversations: a Verifier must read the answer the Solver wrote this turn, and the
search router and the generator/verifier/refiner teams choose who speaks next, so there is no fixed cycle
(``search-orchestrator-v0`` and ``math-generator-verifier-refiner-v0`` fail mid-episode with PettingZoo's
"expects agents to step in a cycle"). :data:`NOT_PARALLELIZABLE` is the flag's value: it is not a bool, and
testing its truth raises a ``TypeError`` that names the drmas Parallel view to use instead,
:func:`drmas_envs.wrappers.to_parallel`, before any step is played.

Example:
    >>> from pettingzoo.utils.conversions import aec_to_parallel
    >>> aec_to_parallel(drmas_envs.make("search-orchestrator-v0"))
    Traceback (most recent call last):
    TypeError: drmas envs are turn-based: ... use drmas_envs.wrappers.to_parallel(env) ...
"""

from __future__ import annotations

__all__ = ["NOT_PARALLELIZABLE", "NotParallelizable", "TO_PARALLEL_HINT"]

#: The message of the error raised when code tests whether a drmas env is parallelizable.
TO_PARALLEL_HINT = (
    "drmas envs are turn-based: one agent speaks per step, and who speaks next depends on what was said "
    "(e.g. search-orchestrator-v0, math-generator-verifier-refiner-v0), so PettingZoo's aec_to_parallel, "
    "which steps every agent once per cycle from stale observations, does not apply. Use "
    "drmas_envs.wrappers.to_parallel(env) (acting_only=True for RLlib), or the AEC env itself "
    "(see docs/plugging-in.md)"
)


class NotParallelizable:
    """Value of ``metadata["is_parallelizable"]`` whose truth test raises ``TypeError(TO_PARALLEL_HINT)``.

    Any code that asks ``if env.metadata["is_parallelizable"]`` (PettingZoo's ``aec_to_parallel`` does, in an
    ``assert``) gets the pointer to :func:`drmas_envs.wrappers.to_parallel` instead of a mid-episode
    assertion. (Under ``python -O`` PettingZoo's ``assert`` is stripped and its own mid-episode check fires.)
    Copying, pickling, ``repr`` and ``== False`` behave as for a plain value.

    Raises:
        TypeError: from ``bool(flag)``, always.
    """

    def __bool__(self) -> bool:
        raise TypeError(TO_PARALLEL_HINT)

    def __eq__(self, other: object) -> bool:
        return other is False or isinstance(other, NotParallelizable)

    def __hash__(self) -> int:
        return hash(False)

    def __repr__(self) -> str:
        return "NOT_PARALLELIZABLE"

    def __reduce__(self) -> str:
        return "NOT_PARALLELIZABLE"  # unpickles to the module singleton


#: The single instance used in :attr:`drmas_envs.core.TextAECEnv.metadata`.
NOT_PARALLELIZABLE = NotParallelizable()
