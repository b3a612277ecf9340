"""Known-nonconformance files: one line per check id glob with its reason, turned into strict
xfails (when the engine is fixed, the run says so). The default file of an engine is
suites/xfails/<engine>@<bundle>.txt where the bundle run has its own list, else
suites/xfails/<engine>.txt (the committed default bundle's); an adapter outside the package
passes its own with --xfails.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class XfailRule:
    """One line of an xfails file: `<check id glob>  # reason`. Only * and ? are wildcards,
    so the brackets of parametrized ids match literally."""

    pattern: str
    reason: str
    where: str

    def matches(self, *ids: str) -> bool:
        rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in self.pattern)
        return any(re.fullmatch(rx, i) for i in ids)


class XfailsError(ValueError):
    """An xfails file that cannot be read as text; the message is one line with the fix."""


def read_xfails(path: Path) -> list[XfailRule]:
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise XfailsError(f"xfails file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} "
                          f"at offset {e.start}); save it as UTF-8") from None
    except OSError as e:
        raise XfailsError(f"xfails file {path} cannot be read ({e.strerror or e}); fix its "
                          f"permissions or pass another --xfails") from None
    rules = []
    for n, raw in enumerate(text.splitlines(), 1):
        pattern, _, reason = raw.partition("#")
        if pattern.strip():
            rules.append(XfailRule(pattern.strip(), reason.strip() or "known nonconformance",
                                   f"{path}:{n}"))
    return rules


def xfails_file_name(engine: str, bundle: str | None = None) -> str:
    """`<engine>.txt`, or with `bundle` `<engine>@<bundle>.txt` (names made file-safe)."""
    stem = re.sub(r"[^\w.-]", "_", engine)
    if bundle:
        stem += "@" + re.sub(r"[^\w.-]", "_", bundle)
    return stem + ".txt"


def default_xfails_path(folder: Path, engine: str, bundle: str | None) -> Path:
    """The engine's known nonconformances on this bundle: its own list in `folder` where it
    has one, else the engine's list. Why per bundle: a known nonconformance is a finding about
    an engine on one target. llama.cpp's on golden/tiny-dsv3 (its deepseek2 graph records no
    layer input: every draft engine_cannot_express) is not its finding on golden/tiny-qwen3moe,
    where specforge-default passes every check, and a strict xfail there would fail it."""
    if bundle:
        own = folder / xfails_file_name(engine, bundle)
        if own.is_file():
            return own
    return folder / xfails_file_name(engine)


def check_id(nodeid: str) -> str:
    """The id in reports and xfails files: file name :: test[params], the same whatever
    folder pytest was started from."""
    path, sep, rest = nodeid.partition("::")
    return f"{Path(path).name}{sep}{rest}"
