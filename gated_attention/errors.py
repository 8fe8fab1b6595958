"""The one kind of error a user can fix: bad input, named by its field and allowed values.

Validation sites raise `UserError` (or a subclass naming the area, e.g. `ConfigError`); the
entry points print it as one line and exit 2. Every other exception is a code bug and keeps
its traceback."""
from __future__ import annotations


class UserError(ValueError):
    """Input the user can correct: the message names the field and what is allowed."""
