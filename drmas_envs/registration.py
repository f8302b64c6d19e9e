"""Environment registry: ``register``, ``make``, ``spec``, ``registry``, ``pprint_registry``.

Ids follow Gymnasium's ``[namespace/]name-vN`` grammar, parsed by one regex (:func:`parse_env_id`, whose
inverse is :func:`get_env_id`). An unversioned id (``"math-solver"``) resolves to the latest registered
version. Every lookup failure raises its own subclass of :class:`RegistrationError`, and each message says
what was wrong and what is accepted (closest ids via :mod:`difflib`, known versions, ``pprint_registry()``).

Built-in envs register when :mod:`drmas_envs` is imported. Where pettingzoo >= 1.27 ships its own
registry (``pettingzoo.env_registry``), they are mirrored there under the ``drmas/`` namespace (an id with its own
namespace, ``openspiel/kuhn_poker-v0``, keeps it: PettingZoo's ids have one namespace at most).

Example:
    >>> import drmas_envs
    >>> env = drmas_envs.make("math-solver-verifier-v0", max_loops=3)
    >>> drmas_envs.spec("math-solver-verifier").version
    0
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

from drmas_envs._rng import global_rng_preserved

__all__ = [
    "EnvSpec",
    "RegistrationError",
    "InvalidEnvIdError",
    "NameNotFoundError",
    "VersionNotFoundError",
    "AlreadyRegisteredError",
    "UnknownKwargError",
    "parse_env_id",
    "get_env_id",
    "register",
    "make",
    "spec",
    "registry",
    "pprint_registry",
]

#: ``[namespace/]name[-vN]``: name is lower-case words joined by ``-`` or ``_``; version a non-negative int.
ENV_ID_RE = re.compile(
    r"^(?:(?P<namespace>[a-z0-9_\-]+)/)?(?P<name>[a-z0-9][a-z0-9_\-]*?)(?:-v(?P<version>\d+))?$"
)


class RegistrationError(Exception):
    """Base class of every registry error, so callers can catch them all at once."""


class InvalidEnvIdError(RegistrationError, ValueError):
    """The id does not follow ``[namespace/]name-vN``."""


class NameNotFoundError(RegistrationError, KeyError):
    """No env of that name is registered."""

    def __str__(self) -> str:  # KeyError would quote the message.
        return str(self.args[0])


class VersionNotFoundError(RegistrationError, KeyError):
    """The name exists but not with that version."""

    def __str__(self) -> str:
        return str(self.args[0])


class AlreadyRegisteredError(RegistrationError, ValueError):
    """``register`` was called twice with one id."""


class UnknownKwargError(RegistrationError, TypeError):
    """``make`` got a keyword argument that the env constructor does not accept."""


def parse_env_id(env_id: str) -> tuple[str | None, str, int | None]:
    """Split ``"[namespace/]name[-vN]"`` into ``(namespace, name, version)``.

    Raises:
        InvalidEnvIdError: if ``env_id`` is not a str or does not match the grammar.
    """
    if not isinstance(env_id, str):
        raise InvalidEnvIdError(f"env id must be a str like 'math-solver-v0', got {type(env_id).__name__}")
    match = ENV_ID_RE.fullmatch(env_id)
    if match is None:
        raise InvalidEnvIdError(
            f"malformed env id {env_id!r}: expected '[namespace/]name-vN' with lower-case letters, digits, "
            "'-' or '_' (e.g. 'math-solver-verifier-v0' or 'drmas/search-r1-v0')"
        )
    version = match.group("version")
    return match.group("namespace"), match.group("name"), None if version is None else int(version)


def get_env_id(namespace: str | None, name: str, version: int | None) -> str:
    """Inverse of :func:`parse_env_id`."""
    full = name if version is None else f"{name}-v{version}"
    return full if namespace is None else f"{namespace}/{full}"


@dataclasses.dataclass
class EnvSpec:
    """Everything needed to build one registered env.

    Attributes:
        id: the full id, ``[namespace/]name-vN``.
        entry_point: a callable returning an env, or a ``"module.path:attr"`` string imported lazily.
        kwargs: default keyword arguments; ``make(id, **kw)`` overrides them key by key.
        namespace, name, version: parsed from ``id`` (never set by hand, so they cannot disagree with it).
    """

    id: str
    entry_point: Callable[..., Any] | str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    namespace: str | None = dataclasses.field(init=False)
    name: str = dataclasses.field(init=False)
    version: int | None = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.namespace, self.name, self.version = parse_env_id(self.id)

    def load(self) -> Callable[..., Any]:
        """Resolve :attr:`entry_point` to a callable.

        Raises:
            RegistrationError: if the ``module:attr`` string cannot be imported.
        """
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise RegistrationError(
                f"env {self.id!r}: cannot import module {module_name!r} of entry point {self.entry_point!r}: {err}"
            ) from err
        try:
            return getattr(module, attr)
        except AttributeError as err:
            raise RegistrationError(f"env {self.id!r}: module {module_name!r} has no attribute {attr!r}") from err

    def make(self, **kwargs: Any) -> Any:
        """Build the env with ``self.kwargs`` overridden by ``kwargs`` (see :func:`make`)."""
        with global_rng_preserved():  # a dependency imported on first use must not move random / numpy's state
            factory = self.load()
            merged = {**self.kwargs, **kwargs}
            _check_kwargs(self.id, factory, merged)
            try:
                env = factory(**merged)
            except TypeError as err:
                raise TypeError(f"{err} (while making env {self.id!r} with kwargs {merged!r})") from err
        env.spec = self  # type: ignore[attr-defined]
        return env

    def pprint(self) -> str:
        """Human-readable summary: id, entry point and the non-empty default kwargs."""
        lines = [f"id={self.id}", f"entry_point={self.entry_point}"]
        if self.kwargs:
            lines.append(f"kwargs={self.kwargs}")
        return "\n".join(lines)


def _check_kwargs(env_id: str, factory: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = sorted(n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    for key in kwargs:
        if key not in params:
            close = difflib.get_close_matches(key, accepted, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise UnknownKwargError(
                f"env {env_id!r} got an unknown keyword argument {key!r}.{hint} Accepted: {', '.join(accepted)}"
            )


#: All registered specs, keyed by full id.
registry: dict[str, EnvSpec] = {}


def register(env_id: str, entry_point: Callable[..., Any] | str, **default_kwargs: Any) -> EnvSpec:
    """Register an env under ``env_id`` (must carry a version, ``name-vN``).

    Raises:
        InvalidEnvIdError: if the id is malformed or has no version.
        AlreadyRegisteredError: if the id is already registered.
    """
    _, name, version = parse_env_id(env_id)
    if version is None:
        raise InvalidEnvIdError(f"register needs a versioned id like '{name}-v0', got {env_id!r}")
    if env_id in registry:
        raise AlreadyRegisteredError(f"env id {env_id!r} is already registered (entry point {registry[env_id].entry_point})")
    new_spec = EnvSpec(env_id, entry_point, dict(default_kwargs))
    registry[env_id] = new_spec
    _mirror_into_pettingzoo(new_spec)
    return new_spec


def spec(env_id: str) -> EnvSpec:
    """Look up the spec of ``env_id``; an unversioned id gives the latest version.

    Raises:
        InvalidEnvIdError: malformed id.
        NameNotFoundError: no env of that name (the message suggests the closest registered ids).
        VersionNotFoundError: the name exists with other versions (the message lists them).
    """
    namespace, name, version = parse_env_id(env_id)
    versions = {s.version: s for s in registry.values() if s.namespace == namespace and s.name == name}
    if not versions:
        known = sorted(registry)
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise NameNotFoundError(
            f"no env named {get_env_id(namespace, name, None)!r} is registered.{hint} "
            "Every id: `drmas envs` (or drmas_envs.pprint_registry())."
        )
    if version is None:
        return versions[max(versions)]
    if version not in versions:
        listed = ", ".join(get_env_id(namespace, name, v) for v in sorted(versions))
        raise VersionNotFoundError(f"env {env_id!r} has no version v{version}; registered versions: {listed}")
    return versions[version]


def make(env_id: str | EnvSpec, **kwargs: Any) -> Any:
    """Build a registered env: ``make("math-solver-verifier-v0", max_loops=3)``.

    ``kwargs`` override the spec's default kwargs.

    Raises:
        the lookup errors of :func:`spec`; UnknownKwargError for a keyword the env does not accept;
        TypeError (with the id and kwargs added) if the constructor rejects the arguments.
    """
    env_spec = env_id if isinstance(env_id, EnvSpec) else spec(env_id)
    return env_spec.make(**kwargs)


def pprint_registry(print_output: bool = True) -> str | None:
    """Print (or return, with ``print_output=False``) every registered id grouped by namespace."""
    groups: dict[str, list[str]] = {}
    for env_id, s in sorted(registry.items()):
        groups.setdefault(s.namespace or "(default)", []).append(env_id)
    text = "\n".join(f"===== {ns} =====\n" + "\n".join(ids) for ns, ids in groups.items())
    if print_output:
        print(text)
        return None
    return text


def _mirror_into_pettingzoo(env_spec: EnvSpec) -> None:
    """Register ``env_spec`` in pettingzoo's own registry when pettingzoo has one (>= 1.27): as ``drmas/<id>``, or
    as the id itself when it has a namespace (``openspiel/kuhn_poker-v0``), as Gymnasium's mirror does."""
    try:
        pz_registry = importlib.import_module("pettingzoo.env_registry")
    except ImportError:
        return
    pz_register = getattr(pz_registry, "register", None)
    if pz_register is None:
        return
    try:
        pz_id = env_spec.id if env_spec.namespace is not None else f"drmas/{env_spec.id}"
        pz_register("aec", pz_id, env_spec.entry_point, kwargs=dict(env_spec.kwargs))
    except Exception:  # noqa: BLE001 - an incompatible pettingzoo registry must not break our own
        return
