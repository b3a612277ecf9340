"""Engine lookup: a short name, a bug-zoo mutant (`zoo:<name>`) or any adapter by dotted path
(`mypkg.module:MyEngine`), so a vendor certifies an engine without touching this package.

Two failures are kept apart on purpose. A name that leads to no adapter (typo, wrong path) is
the user's mistake: `EngineLookupError`, one line listing the known names, exit 2 in the CLI.
An adapter that exists but whose engine is not installed here is `EngineUnavailable`: the
engine's checks skip with that reason, the rest of the suite still runs.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from typing import Any

BUILTIN: dict[str, str] = {
    "reference": "harness.engines.reference:ReferenceEngine",
    "vllm": "harness.engines.vllm:VllmEngine",
    "sglang": "harness.engines.sglang:SglangEngine",
    "llamacpp": "harness.engines.llamacpp:LlamacppEngine",
}
ZOO_PREFIX = "zoo:"
ZOO_MODULE = "harness.engines.zoo"
_DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class EngineLookupError(ValueError):
    """No adapter behind this name; the message is one line with the fix."""


def zoo_mutants() -> dict[str, Any]:
    """The bug zoo, or {} while it is not there (it is optional for everything but selftest)."""
    try:
        module = importlib.import_module(ZOO_MODULE)
    except ModuleNotFoundError as e:
        if e.name in (ZOO_MODULE, "harness.engines"):
            return {}
        raise
    return dict(getattr(module, "MUTANTS", {}))


def known_names() -> list[str]:
    try:
        zoo = [ZOO_PREFIX + n for n in sorted(zoo_mutants())]
    except Exception:  # a broken zoo must not hide the real error being worded
        zoo = [ZOO_PREFIX + "<mutant>"]
    return list(BUILTIN) + zoo


def _unknown(name: str, why: str) -> EngineLookupError:
    names = ", ".join(known_names())
    return EngineLookupError(f"{why}; use one of {names}, or a dotted path "
                             f"'package.module:EngineClass' to an Engine subclass")


def check_engine_name(name: str) -> None:
    """Cheap syntax check (no engine import), for pytest start-up."""
    if name in BUILTIN or _DOTTED.match(name):
        return
    if name.startswith(ZOO_PREFIX) and name[len(ZOO_PREFIX):]:
        return
    raise _unknown(name, f"unknown engine {name!r}")


def _current_folder_importable() -> None:
    """A user's adapter named `pkg.module:Class` is found in the current folder, as
    `python -m pytest` or `python -m harness.cli` would find it: the console script alone
    does not put the current folder on sys.path, so ADAPTERS.md's
    `--engine examples.template_adapter:TemplateEngine` failed from a fresh clone. Appended,
    so an installed package of the same name still wins."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


def _load(path: str, builtin: bool) -> type:
    from harness.engines.base import EngineUnavailable

    module_name, _, attr = path.partition(":")
    if not builtin:
        _current_folder_importable()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            if builtin:  # a name --help offers, whose adapter this checkout does not have
                raise EngineLookupError(
                    f"engine {path.partition(':')[0].rsplit('.', 1)[-1]!r} has no adapter in this "
                    f"checkout ({module_name} is missing); use another engine or update "
                    f"eagle3-conformance") from None
            raise _unknown(path, f"cannot import {module_name} (no module {missing!r}, neither "
                                 f"installed nor in the current folder {os.getcwd()}); check the "
                                 f"path, run from the folder that holds it, or install the "
                                 f"package that provides it") from None
        if not builtin:  # the user's own adapter is broken: their input, not our engine
            raise EngineLookupError(f"cannot import {module_name}: it needs {missing!r}, which is "
                                    f"not installed; install it or fix the adapter") from None
        if not missing:  # raised by a package's own lazy import (transformers'), no module named
            raise EngineUnavailable(f"{module_name} failed to import: "
                                    f"{(str(e).strip().splitlines() or [''])[0]}") from None
        raise EngineUnavailable(f"{module_name} needs {missing!r}, which is not installed; "
                                f"install the engine (e.g. pip install -e '.[vllm]')") from None
    except Exception as e:  # engines fail at import in many ways (no GPU, ABI clash)
        first = (str(e).strip().splitlines() or [""])[0]
        if not builtin:
            raise EngineLookupError(f"cannot import {module_name} ({type(e).__name__}: {first}); "
                                    f"fix the adapter module") from None
        raise EngineUnavailable(f"importing {module_name} failed here: "
                                f"{type(e).__name__}: {first}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise _unknown(path, f"{module_name} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _mutant_class(entry: Any) -> Any:
    """A zoo entry is the mutant Engine class itself, or a record naming it (`.engine`/`.cls`)."""
    if isinstance(entry, type):
        return entry
    for attr in ("engine", "engine_class", "cls"):
        if isinstance(getattr(entry, attr, None), type):
            return getattr(entry, attr)
    return entry


def resolve_engine(name: str) -> type:
    """The Engine subclass behind `name`. Raises EngineLookupError or EngineUnavailable."""
    from harness.engines.base import Engine

    check_engine_name(name)
    if name.startswith(ZOO_PREFIX):
        mutant = name[len(ZOO_PREFIX):]
        zoo = zoo_mutants()
        if mutant not in zoo:
            raise _unknown(name, f"no bug-zoo mutant {mutant!r}")
        cls = _mutant_class(zoo[mutant])
    else:
        cls = _load(BUILTIN.get(name, name), builtin=name in BUILTIN)
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        raise EngineLookupError(f"{name} resolves to {cls!r}, not a subclass of "
                                f"harness.engines.base.Engine; point at the adapter class")
    if inspect.isabstract(cls):
        raise EngineLookupError(f"{name} is abstract ({', '.join(sorted(cls.__abstractmethods__))} "
                                f"not implemented); point at a concrete adapter class")
    return cls


def engine_path(cls: type) -> str:
    """'module:Class', the form --engine takes, for the report."""
    return f"{cls.__module__}:{cls.__qualname__}"
