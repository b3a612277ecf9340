"""Engine lookup: built-in names, bug-zoo names, adapters by dotted path, and one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.engines.base import Engine
from harness.engines.reference import ReferenceEngine
from harness.run.registry import (
    BUILTIN,
    EngineLookupError,
    check_engine_name,
    engine_path,
    known_names,
    resolve_engine,
    zoo_mutants,
)


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path for modules that live outside the package."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("vendor_")]:
        del sys.modules[name]


def test_builtin_names_map_to_adapter_paths() -> None:
    assert BUILTIN == {"reference": "harness.engines.reference:ReferenceEngine",
                       "vllm": "harness.engines.vllm:VllmEngine",
                       "sglang": "harness.engines.sglang:SglangEngine",
                       "llamacpp": "harness.engines.llamacpp:LlamacppEngine"}
    assert resolve_engine("reference") is ReferenceEngine
    assert known_names()[:4] == ["reference", "vllm", "sglang", "llamacpp"]


def test_dotted_path_loads_an_adapter_from_outside_the_package(outside: Path) -> None:
    (outside / "vendor_adapter.py").write_text(
        "from harness.engines.reference import ReferenceEngine as VendorEngine\n")
    cls = resolve_engine("vendor_adapter:VendorEngine")
    assert cls is ReferenceEngine
    assert engine_path(cls) == "harness.engines.reference:ReferenceEngine"
    assert resolve_engine(engine_path(cls)) is cls


@pytest.mark.parametrize("name, needle", [
    ("nope", "unknown engine 'nope'"),
    ("Reference", "unknown engine 'Reference'"),
    ("zoo:", "unknown engine 'zoo:'"),
    ("zoo:no_such_mutant", "no bug-zoo mutant 'no_such_mutant'"),
    ("vendor_missing_module:Engine", "cannot import vendor_missing_module"),
    ("harness.engines.base:NoSuchClass", "has no 'NoSuchClass'"),
    ("harness.engines.base:Capability", "not a subclass of harness.engines.base.Engine"),
    ("harness.engines.base:Engine", "is abstract"),
])
def test_lookup_errors_are_one_line_with_the_fix(name: str, needle: str) -> None:
    with pytest.raises(EngineLookupError) as err:
        resolve_engine(name)
    text = str(err.value)
    assert needle in text and "\n" not in text
    if "unknown engine" in needle or "mutant" in needle:
        assert "reference, vllm, sglang, llamacpp" in text


def test_user_adapter_missing_dependency_is_bad_input(outside: Path) -> None:
    """The user's own adapter failing at import is their input to fix (exit 2), not an
    unavailable engine whose checks skip into a nonconformant verdict (issue #9)."""
    (outside / "vendor_needs_dep.py").write_text("import vendor_engine_runtime_not_installed\n")
    with pytest.raises(EngineLookupError, match="vendor_engine_runtime_not_installed"):
        resolve_engine("vendor_needs_dep:Engine")


def test_user_adapter_that_fails_at_import_is_bad_input(outside: Path) -> None:
    (outside / "vendor_broken.py").write_text("raise RuntimeError('no CUDA device\\nmore')\n")
    with pytest.raises(EngineLookupError, match=r"RuntimeError: no CUDA device\); fix the adapter"):
        resolve_engine("vendor_broken:Engine")


def test_name_syntax_check_imports_nothing() -> None:
    for ok in ("reference", "vllm", "zoo:anything", "pkg.mod:Cls", "pkg:Outer.Inner"):
        check_engine_name(ok)
    for bad in ("", "pkg.mod", "pkg.mod:", ":Cls", "a b:C"):
        with pytest.raises(EngineLookupError):
            check_engine_name(bad)


def test_every_zoo_mutant_resolves() -> None:
    zoo = zoo_mutants()
    if not zoo:
        pytest.skip("harness.engines.zoo is not there yet")
    for name in zoo:
        cls = resolve_engine(f"zoo:{name}")
        assert issubclass(cls, Engine)
        assert f"zoo:{name}" in known_names()
