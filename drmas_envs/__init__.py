"""drmas_envs: multi-agent text environments (PettingZoo AEC) whose agents are LLM policies.

    >>> import drmas_envs
    >>> env = drmas_envs.make("math-solver-verifier-v0")
    >>> env.reset(seed=0)

No torch is imported anywhere in this package: envs take text in and give text, rewards and infos out.
"""

from drmas_envs._rng import global_rng_preserved

_rng_guard = global_rng_preserved()  # importing drmas_envs leaves random / numpy's global state as it was
_rng_guard.__enter__()

from drmas_envs.core import ListTaskSource  # noqa: E402, Task, TaskSource, TextAECEnv
from drmas_envs.registration import (  # noqa: E402
    EnvSpec,
    RegistrationError,
    make,
    pprint_registry,
    register,
    registry,
    spec,
)

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "RegistrationError",
    "make",
    "pprint_registry",
    "register",
    "registry",
    "spec",
    "Task",
    "TaskSource",
    "ListTaskSource",
    "TextAECEnv",
    "__version__",
]

from drmas_envs import (  # noqa: E402
    _builtin,  # noqa: E402,F401  (registers the built-in envs)
    wrappers,  # noqa: E402,F401  (mirrors every id into Gymnasium as "drmas/<id>")
)

_rng_guard.__exit__(None, None, None)
del _rng_guard
