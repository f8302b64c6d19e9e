"""drmas_envs: multi-agent text environments (PettingZoo AEC) whose agents are LLM policies.

    >>> import drmas_envs
    >>> env = drmas_envs.make("math-solver-verifier-v0")
    >>> env.reset(seed=0)

No torch is imported anywhere in this package: envs take text in and give text, rewards and infos out.

The top level is the registry (:func:`make`, :func:`register`, :func:`spec`, :data:`registry`,
:func:`pprint_registry`, :class:`EnvSpec` and the :class:`RegistrationError` every lookup error derives from) and
the records every env shares (:class:`Task`, :class:`TaskSource`, :class:`ListTaskSource`, :class:`TextAECEnv`,
:class:`EpisodeRecord`, :class:`CallRecord`, :func:`episode_record`, :func:`play_episode`); ``__all__`` lists
exactly these (tests/architecture/test_public_api.py). The subpackages sit on floors, bottom first (docs/architecture.md,
"drmas_envs's floors"; tests/architecture/test_layout.py): 0 ``_rng``, 1 ``core``, 2 ``data``, 3 ``math`` /
``search`` / ``games`` (never each other), 4 ``registration``, 5 ``wrappers`` and ``_builtin``, 6 ``testing``.
"""

from drmas_envs._rng import global_rng_preserved

_rng_guard = global_rng_preserved()  # importing drmas_envs leaves random / numpy's global state as it was
_rng_guard.__enter__()

from drmas_envs.core import (  # noqa: E402
    CallRecord,
    EpisodeRecord,
    ListTaskSource,
    Task,
    TaskSource,
    TextAECEnv,
    episode_record,
    play_episode,
)
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
    "EpisodeRecord",
    "CallRecord",
    "episode_record",
    "play_episode",
    "__version__",
]

from drmas_envs import (  # noqa: E402
    _builtin,  # noqa: E402,F401  (registers the built-in envs)
    wrappers,  # noqa: E402,F401  (mirrors every id into Gymnasium as "drmas/<id>")
)

_rng_guard.__exit__(None, None, None)
del _rng_guard
