"""convert-check on the converter zoo (harness/tools/converter_zoo.py) and on its own bounds:
the faithful converter is certified, each broken converter is caught with its kind (the check
can fail, and names why), and the rounding bound of a narrowed dtype passes a correct cast and
fails a truncating one. The real converters (speculators, llama.cpp) are in
tests/test_convert_check_real.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from harness import cli
from harness.golden.paths import default_bundle_path
from harness.tools.convert_check import EXIT, cast_bound, compare_tensor
from harness.tools.converter_zoo import ZOO, convert

BUNDLE = default_bundle_path()
MANIFEST = json.loads((BUNDLE / "manifest.json").read_text())


def _trainer(draft: str) -> str:
    return MANIFEST["drafts"][draft]["convention"]


def _check(argv: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    capsys.readouterr()
    code = cli.main(["convert-check", *argv, "--json", str(out)])
    printed = capsys.readouterr().out
    return code, json.loads(out.read_text()), printed


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_converter_is_caught_with_its_kind(name: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    entry = ZOO[name]
    source = BUNDLE / f"draft-{entry.draft}"
    out = convert(entry, source, tmp_path / name, BUNDLE / "target", _trainer(entry.draft))
    code, outcome, printed = _check([str(source), str(out), "--to-convention", entry.to_convention,
                                     "--target", str(BUNDLE / "target")], tmp_path / "cc.json", capsys)
    kinds = {(f["kind"], f["offset"]) for f in outcome["findings"]}
    if entry.expected_kind == "ok":
        assert (code, outcome["verdict"], kinds) == (0, "certified", set()), printed
        return
    assert code == 1 and outcome["verdict"] == "not certified", printed
    assert (entry.expected_kind, entry.expected_offset) in kinds, (
        f"zoo converter {name} ({entry.what}): expected {entry.expected_kind}, convert-check "
        f"named {sorted(kinds, key=str)}:\n{printed}")
    assert printed.splitlines()[0].startswith("NOT CERTIFIED: "), printed


def test_dropped_ids_are_ids_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A converted draft with no ids leaves the engine to its defaults: named even where the
    defaults happen to equal training's boundaries (specforge-default on N = 8)."""
    out = convert(ZOO["faithful"], BUNDLE / "draft-specforge-default", tmp_path / "c", BUNDLE / "target",
                  "specforge")
    cfg = json.loads((out / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = None
    (out / "config.json").write_text(json.dumps(cfg))
    code, outcome, printed = _check([str(BUNDLE / "draft-specforge-default"), str(out), "--target",
                                     str(BUNDLE / "target")], tmp_path / "cc.json", capsys)
    assert code == 1 and [f["kind"] for f in outcome["findings"]] == ["ids_ignored"], printed
    assert "by coincidence of its depth" in printed


def test_unknown_trainer_convention_cannot_tell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A SpecForge-format source outside a bundle names no trainer: the boundaries cannot be
    judged (exit 4), never certified on a guessed convention."""
    source = tmp_path / "draft"
    shutil.copytree(BUNDLE / "draft-specforge-default", source)
    out = convert(ZOO["faithful"], source, tmp_path / "c", BUNDLE / "target", "specforge")
    code, outcome, printed = _check([str(source), str(out), "--target", str(BUNDLE / "target")],
                                    tmp_path / "cc.json", capsys)
    assert (code, outcome["verdict"]) == (EXIT["cannot tell"], "cannot tell"), printed
    assert "--from-convention" in printed
    code, outcome, _ = _check([str(source), str(out), "--target", str(BUNDLE / "target"),
                               "--from-convention", "specforge"], tmp_path / "cc.json", capsys)
    assert (code, outcome["verdict"]) == (0, "certified")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_rounding_cast_is_within_the_bound_and_a_truncating_one_is_not(dtype: torch.dtype) -> None:
    """The bound u * |x| (subnormals: half their spacing) holds every round-to-nearest cast,
    subnormal and tiny values included, and is crossed by truncation (error up to 2u)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=gen) * torch.logspace(-30, 3, 4096)
    rounded = compare_tensor("w", x, x.to(dtype))
    assert rounded.status == "within rounding" and rounded.ratio is not None and rounded.ratio <= 1.0
    if dtype == torch.bfloat16:  # bf16 is fp32's top 16 bits: truncation drops the rest
        truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)
        assert compare_tensor("w", x, truncated).status == "changed"
    assert not bool(cast_bound(x.to(dtype), torch.float32).any()), "widening must be exact"
    assert compare_tensor("w", x.to(dtype), x.to(dtype).float()).status == "exact"
