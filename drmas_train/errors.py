"""Error types shared by every stage of drmas_train (the bottom floor of docs/architecture.md)."""

from __future__ import annotations

__all__ = ["ConfigError", "require"]


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key, the bad value and what is accepted.

    Every stage's config section raises it from its own checks; ``drmas`` commands turn it into exit code 2 with
    that one message.
    """


def require(ok: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``ok`` (the config sections' checks read as a list)."""
    if not ok:
        raise ConfigError(message)
