"""drmas_envs: multi-agent text environments (PettingZoo AEC) whose agents are LLM policies.

    >>> import drmas_envs
    >>> env = drmas_envs.make("math-solver-verifier-v0")
    >>> env.reset(seed=0)

No torch is imported anywhere in this package: envs take text in and give text, rewards and infos out.
"""

from drmas_envs.core import ListTaskSource, Task, TaskSource, TextAECEnv
from drmas_envs.registration import (
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

from drmas_envs import (
    _builtin,  # noqa: E402,F401  (registers the built-in envs)
    wrappers,  # noqa: E402,F401  (mirrors every id into Gymnasium as "drmas/<id>")
)
