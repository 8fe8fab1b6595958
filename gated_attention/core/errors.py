"""The one kind of error a user can fix: bad input, named by its field and allowed values.

Validation sites raise `UserError` (or a subclass naming the area, e.g. `ConfigError`); the
entry points print it as one line and exit 2. Every other exception is a code bug and keeps
its traceback."""
from __future__ import annotations

import sys
from typing import NoReturn


class UserError(ValueError):
    """Input the user can correct: the message names the field and what is allowed."""


EXIT_CODE = 2  # a user error; 1 stays for a failed run (did not fit, diverged)


def exit_with(message: str) -> NoReturn:
    """The entry points' one formatter: the message on stderr, exit status 2."""
    print(message, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_CODE)


def fail(err: BaseException, prefix: str = "Error") -> NoReturn:
    """`<prefix>: <message>` for a user error caught at an entry point."""
    exit_with(f"{prefix}: {message_of(err)}")


def message_of(err: BaseException) -> str:
    """The error's message; a KeyError's repr quotes are dropped."""
    text = str(err)
    return text.strip("'\"") if isinstance(err, KeyError) else text


def user_error_in(err: BaseException) -> UserError | None:
    """The first UserError raised on the way to `err`: ml_collections re-raises a config
    file's exception as one of the same type holding a traceback text, and absl wraps that in
    a flags.Error; the innermost one holds the message as it was raised."""
    found, seen = None, err
    while seen is not None:
        if isinstance(seen, UserError):
            found = seen
        seen = seen.__cause__ or seen.__context__
    return found
