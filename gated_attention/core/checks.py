"""What every section's validation is made of: `ConfigError` and the two checks it raises.

Each section of the run config is checked by the module that owns it (model_config, optim,
train_config, data.registry and the data sources); they all raise `ConfigError`, a
`UserError`, whose message names the field and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gated_attention.core.errors import UserError


class ConfigError(UserError):
    """A config field is missing, out of range, or not one of its allowed values."""


def choice(field: str, value: Any, allowed: Iterable[Any],
           error: type[UserError] = ConfigError) -> None:
    """Raise `error` unless `value` is one of `allowed` (named in the message); `error` names
    the area (a VariantError, or a plain UserError for a kernel argument)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise error(f"{field}={value!r} is not allowed; choose one of "
                    f"{', '.join(map(str, allowed))}")


def require(ok: bool, message: str) -> None:
    """Raise ConfigError(message) unless `ok`; the message names the field and its range."""
    if not ok:
        raise ConfigError(message)
