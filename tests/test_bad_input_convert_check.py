"""convert-check refuses what it cannot read in one `error:` line naming the problem and the
fix, exit 2, no traceback (docs/CLI.md), before any comparison."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from bad_input import refused

from harness.golden.paths import default_bundle_path

BUNDLE = default_bundle_path()
DRAFT = BUNDLE / "draft-specforge-default"
TARGET = BUNDLE / "target"


def _copy(tmp: Path, change: Callable[[Path], None] | None = None) -> Path:
    folder = tmp / "draft"
    shutil.copytree(DRAFT, folder)
    if change:
        change(folder)
    return folder


def _write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        path = folder / name
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    return change


@pytest.mark.parametrize("change, needle", [
    (lambda f: (f / "config.json").unlink(), "holds no config.json"),
    (_write("config.json", "{not json"), "is not JSON"),
    (_write("config.json", "[1, 2]"), "not an object"),
    (_write("model.safetensors", b"garbage"), "cannot be read"),
    (_write("extra.safetensors", b"x"), "holds 2 .safetensors files"),
    (lambda f: (f / "config.json").write_text(json.dumps(
        {**json.loads((DRAFT / "config.json").read_text()),
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": ["1", 3, 4]}})), "not a list of integers"),
])
def test_unreadable_converted_draft(change: Callable[[Path], None], needle: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    refused(["convert-check", str(DRAFT), str(_copy(tmp_path, change)), "--to-engine", "vllm",
             "--target", str(TARGET)], capsys, needle)


def test_paths_and_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["convert-check", str(DRAFT), str(DRAFT), "--target", str(TARGET)]
    refused(["convert-check", str(tmp_path / "nope"), str(DRAFT), "--target", str(TARGET)], capsys, "SOURCE")
    (tmp_path / "draft.bin").write_text("x")
    refused(["convert-check", str(DRAFT), str(tmp_path / "draft.bin")], capsys, "not a .gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF-but-not-really")
    refused(["convert-check", str(DRAFT), str(tmp_path / "bad.gguf"), "--target", str(TARGET)], capsys,
            "not a readable GGUF file")
    refused([*base, "--to-engine", "sglang"], capsys, "--to-convention sglang")
    refused([*base, "--to-engine", "vllm", "--to-convention", "vllm"], capsys, "not allowed with")
    refused([*base, "--from-convention", "specfarge", "--to-engine", "vllm"], capsys, "not a known convention")
    refused([*base[:3], "--to-engine", "vllm"], capsys, "pass --target")
    refused(["convert-check", str(DRAFT), str(DRAFT), "--to-engine", "vllm", "--target", str(tmp_path)],
            capsys, "holds no config.json")
    refused([*base], capsys, "pass --to-engine")
    refused([*base, "--to-engine", "vllm", "--json", str(tmp_path)], capsys, "--json")


def test_source_ids_invalid_under_the_trainer(capsys: pytest.CaptureFixture[str]) -> None:
    """embed-first's -1 is no id in SpecForge's rule: naming that trainer is bad input."""
    refused(["convert-check", str(BUNDLE / "draft-embed-first"), str(DRAFT), "--from-convention",
             "specforge", "--to-engine", "vllm", "--target", str(TARGET)], capsys, "not valid under specforge")


def test_vllm_on_a_target_whose_rule_is_not_modelled(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """--to-engine vllm reads ids by the adapter's own per-architecture table
    (harness.engines.vllm.VLLM_CONVENTIONS); on an architecture it does not hold, convert-check
    names it and the way to state the rule, instead of assuming one (it once read every
    non-DeepSeek target by the EagleModelMixin rule and every DeepSeek-family one by
    deepseek_v2's, neither checked against vLLM for GLM-4 MoE Lite or DeepSeek V3.2)."""
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    config = json.loads((target / "config.json").read_text())
    config["architectures"] = ["Glm4MoeLiteForCausalLM"]
    (target / "config.json").write_text(json.dumps(config))
    line = refused(["convert-check", str(DRAFT), str(DRAFT), "--to-engine", "vllm", "--target",
                    str(target)], capsys, "Glm4MoeLiteForCausalLM is not modelled")
    assert "--to-convention" in line, line
