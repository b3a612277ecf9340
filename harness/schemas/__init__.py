"""JSON Schemas (draft 2020-12) of the documents a run writes, shipped with the package.

`report.v1.schema.json` (report.json, format_version 1) and `certificate.v1.schema.json`
(certificate.json, certificate_version 1). A version is a file: a change of meaning adds
`*.v2.schema.json` beside the old one, so a reader keeps validating the documents it has.
`problems(doc, "certificate")` validates with the `jsonschema` library.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

VERSIONS = {"report": ("format_version", 1), "certificate": ("certificate_version", 1)}


@cache
def schema(kind: str, version: int | None = None) -> dict[str, Any]:
    """The schema of `kind` ("report", "certificate") at `version` (default: the current)."""
    if kind not in VERSIONS:
        raise KeyError(f"no schema for {kind!r}; choose from {', '.join(VERSIONS)}")
    version = VERSIONS[kind][1] if version is None else version
    text = resources.files(__package__).joinpath(f"{kind}.v{version}.schema.json").read_text(
        encoding="utf-8")
    return json.loads(text)


def problems(doc: Any, kind: str) -> list[str]:
    """Why `doc` is not a valid `kind` document, one line each (path: message); [] if valid.
    The schema version is the one the document declares, so an old document is judged by
    its own version's schema."""
    from jsonschema import Draft202012Validator, FormatChecker

    key, current = VERSIONS[kind]
    version = doc.get(key) if isinstance(doc, dict) else None
    try:
        chosen = schema(kind, version if isinstance(version, int) else current)
    except FileNotFoundError:
        return [f"{key} {version!r}: no schema of that version (this suite knows {current})"]
    validator = Draft202012Validator(chosen, format_checker=FormatChecker())
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(document)'}: {e.message}"
            for e in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path])]
