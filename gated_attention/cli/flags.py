"""One way to read a command line: absl flags, defined on a `flags.FlagValues` of the
command's own when it runs, never on import.

The package's scripts and the experiments, benchmarks and test helpers take their flags
through `Command.parse`: bad input exits 2 with one line naming the flag (as the entry
points' other user errors, gated_attention/core/errors.py), `--help` prints the docstring's first
paragraph and the flags, and a fresh FlagValues per call lets tests call a `main(argv)` many
times in one process.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Sequence
from typing import NoReturn

from absl import flags

from gated_attention.core import errors

HELP = ("-h", "--help", "--helpshort", "--helpfull")


@dataclasses.dataclass(frozen=True)
class Command:
    """A command's name, docstring and positional arguments, for its --help and its errors.

    `positional` names the arguments left after the flags, in order; a last name ending in
    "..." takes one or more (its attribute is the name without the dots, a list). `hidden`
    flags work but are left out of --help (test hooks)."""

    prog: str
    doc: str | None = ""
    positional: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()

    def parse(self, flag_values: flags.FlagValues,
              argv: Sequence[str] | None = None) -> types.SimpleNamespace:
        """The flags' values (a hyphen in a name read as "_") and the positional arguments of
        `argv` (default: sys.argv[1:])."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if any(arg in HELP for arg in argv):
            print(self.help(flag_values))
            raise SystemExit(0)
        try:
            rest = flag_values([self.prog, *argv])[1:]
        except (flags.Error, ValueError) as err:  # ValueError: a value given to --noX
            self.error(f"{str(err).splitlines()[0]} (--help lists the flags)")
        values = {name.replace("-", "_"): value
                  for name, value in flag_values.flag_values_dict().items()}
        return types.SimpleNamespace(**values, **self._positional(rest))

    def _positional(self, rest: list[str]) -> dict[str, str | list[str]]:
        names = list(self.positional)
        many = bool(names) and names[-1].endswith("...")
        if len(rest) < len(names) or (len(rest) > len(names) and not many):
            expected = " ".join(name.upper() for name in names) or "none"
            self.error(f"positional arguments: expected {expected}, got "
                       f"{' '.join(rest) or 'none'}")
        if many:
            last = names.pop()[:-3]
            return {**dict(zip(names, rest)), last: rest[len(names):]}
        return dict(zip(names, rest))

    def error(self, message: str) -> NoReturn:
        """Bad input: `<prog>: error: <message>` on stderr, exit 2 (as argparse did)."""
        errors.exit_with(f"{self.prog}: error: {message}")

    def help(self, flag_values: flags.FlagValues) -> str:
        """Usage, summary and the flags but the hidden ones (absl's own --help lists the
        global FLAGS, not a command's own)."""
        shown = flags.FlagValues()
        for name in flag_values:
            if name not in self.hidden:
                shown[name] = flag_values[name]
        usage = " ".join([f"usage: {self.prog} [flags]",
                          *(name.upper() for name in self.positional)])
        summary = (self.doc or "").strip().split("\n\n")[0]  # as argparse's description
        return "\n\n".join(filter(None, [usage, summary, shown.get_help(
            prefix="  ", include_special_flags=False)]))
