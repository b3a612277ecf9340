"""pytest modes that run no check, so can give no verdict.

`--collect-only` lists the checks, `--fixtures` the fixtures, `--setup-plan` and
`--setup-only` the fixtures' set-up; none calls a check. A run in one of them used to end in a
report of all-skipped checks and exit 1 "nonconformant", a verdict about an engine that was
never judged. The plugin writes no report in these modes and the CLI says so and exits 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# config.option attribute -> the flag a user typed
_OPTIONS = {"collectonly": "--collect-only", "showfixtures": "--fixtures",
            "show_fixtures_per_test": "--fixtures-per-test", "setupplan": "--setup-plan",
            "setuponly": "--setup-only"}
# argv spellings (pytest accepts unambiguous prefixes of long options too; these are the
# documented ones and their aliases)
_FLAGS = {"--collect-only": "--collect-only", "--co": "--collect-only",
          "--fixtures": "--fixtures", "--funcargs": "--fixtures",
          "--fixtures-per-test": "--fixtures-per-test", "--setup-plan": "--setup-plan",
          "--setup-only": "--setup-only", "--markers": "--markers", "--help": "--help",
          "-h": "--help", "--version": "--version", "-V": "--version"}


def non_run_mode(config: Any) -> str | None:
    """The flag of the non-run mode this pytest config is in, or None for a real run."""
    option = getattr(config, "option", None)
    return next((flag for attr, flag in _OPTIONS.items() if getattr(option, attr, False)), None)


def non_run_flag(args: Sequence[str]) -> str | None:
    """The non-run mode pytest arguments ask for (`["--co", "-q"]` -> "--collect-only")."""
    return next((_FLAGS[a] for a in args if a in _FLAGS), None)
