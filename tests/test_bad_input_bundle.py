"""Bad bundles: each a copy of the smoke bundle changed one way and re-hashed (a tamperer can
recompute hashes, so only the checks beyond them can refuse it). `run` and `golden verify`
exit 2 with one line naming the file and the fix, and leave no report behind."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from bad_input import edit_json, refused, seed_stale_report, tampered
from safetensors.torch import load_file, save_file

from harness import cli


def _manifest(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    return lambda b: edit_json(b / "manifest.json", change)


def _draft_cfg(change: Callable[[dict], Any], draft: str = "draft-single-aux") -> Callable[[Path], None]:
    return lambda b: edit_json(b / draft / "config.json", change)


def _ids(value: Any) -> Callable[[dict], None]:
    def change(cfg: dict) -> None:
        cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = value
    return change


def _weights(rel: str, change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(b: Path) -> None:
        state = load_file(str(b / rel))
        change(state)
        save_file(state, str(b / rel))
    return apply


def _nan_first(key: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(state: dict[str, torch.Tensor]) -> None:
        state[key].view(-1)[0] = float("nan")
    return change


def _symlink_out(b: Path) -> None:
    outside = b.parent / f"{b.name}-outside.json"
    outside.write_text("{}")
    (b / "target" / "generation_config.json").unlink()
    os.symlink(outside, b / "target" / "generation_config.json")


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "path-dotdot": (_manifest(lambda m: m["files"].update({"../../../etc/hostname": "0" * 64})),
                    "points outside the bundle"),
    "path-absolute": (_manifest(lambda m: m["files"].update({"/etc/hostname": "0" * 64})),
                      "points outside the bundle"),
    "path-symlink-out": (_symlink_out, "resolves outside the bundle"),
    "digest-not-string": (_manifest(lambda m: m["files"].update({"tensors.safetensors": 7})),
                          "not a hex string"),
    "drafts-a-list": (_manifest(lambda m: m.update(drafts=["single-aux"])),
                      "'drafts' must be a JSON object"),
    "target-a-string": (_manifest(lambda m: m.update(target="target")),
                        "'target' must be a JSON object"),
    "prompt-count-string": (_manifest(lambda m: m["prompts"].update(count="4")),
                            "prompts.count is '4'"),
    "draft-folder-escapes": (_manifest(lambda m: m["drafts"]["single-aux"].update(folder="../x")),
                             "folder is inside the bundle"),
    "weights-unreadable": (lambda b: (b / "draft-single-aux" / "model.safetensors").write_bytes(b"\0" * 64),
                           "draft-single-aux/model.safetensors cannot be opened"),
    "target-weights-truncated": (lambda b: (b / "target" / "model.safetensors").write_bytes(
        (b / "target" / "model.safetensors").read_bytes()[:1000]), "target/model.safetensors cannot be opened"),
    "golden-nan": (_weights("tensors.safetensors", _nan_first("boundaries")),
                   "golden tensor 'boundaries'"),
    "golden-inf": (_weights("tensors.safetensors", lambda s: s["single-aux.fc"].view(-1).__setitem__(3, float("inf"))),
                   "golden tensor 'single-aux.fc'"),
    "draft-nan-weights": (_weights("draft-single-aux/model.safetensors", _nan_first("fc.weight")),
                          "tensor 'fc.weight' holds 1 NaN/Inf"),
    "draft-zero-fc": (_weights("draft-single-aux/model.safetensors",
                               lambda s: s.__setitem__("fc.weight", torch.zeros_like(s["fc.weight"]))),
                      "fc.weight is all zeros"),
    "target-config-not-json": (lambda b: (b / "target" / "config.json").write_text("{oops"),
                               "target/config.json cannot be opened"),
    "target-layers-zero": (lambda b: edit_json(b / "target" / "config.json",
                                               lambda c: c.update(num_hidden_layers=0)),
                           "num_hidden_layers is 0"),
    "ids-float": (_draft_cfg(_ids([1.5, 3, 4])), "holds 1.5, not an integer"),
    "ids-empty": (_draft_cfg(_ids([])), "is empty"),
    "ids-string": (_draft_cfg(_ids("one")), "is 'one', must be a list"),
    "ids-bool": (_draft_cfg(_ids([True, 3])), "holds True, not an integer"),
    "ids-repeated": (_draft_cfg(_ids([3, 3])), "repeats an id"),
    "hidden-size-string": (_draft_cfg(lambda c: c.update(hidden_size="64")), "hidden_size is '64'"),
    "eagle-config-list": (_draft_cfg(lambda c: c.update(eagle_config=[3])), "eagle_config is [3]"),
    "norm-flag-string": (_draft_cfg(lambda c: c.update(norm_before_fc="no")), "norm_before_fc is 'no'"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_bundle_is_refused(case: str, smoke_bundle: Path, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    change, needle = CASES[case]
    bad = tampered(smoke_bundle, tmp_path / "bad", change)
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--bundle", str(bad), "--report-dir", str(out)], capsys, needle, out)
    refused(["golden", "verify", str(bad)], capsys, needle)


def test_pinned_digest_detects_rehashed_tampering(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The committed bundle passes --pinned; a copy with one config value changed and every
    hash recomputed passes the plain verify (self-consistent) but not --pinned."""
    from harness.golden.paths import default_bundle_path

    committed = default_bundle_path()
    assert cli.main(["golden", "verify", "--pinned", str(committed)]) == 0
    bad = tampered(committed, tmp_path / "tiny-dsv3",
                   _draft_cfg(lambda c: c.update(rms_norm_eps=1e-5), "draft-specforge-default"))
    assert cli.main(["golden", "verify", str(bad)]) == 0
    refused(["golden", "verify", "--pinned", str(bad)], capsys, "pinned at")


def test_pinned_needs_a_pinned_name(smoke_bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(["golden", "verify", "--pinned", str(smoke_bundle)], capsys, "no pinned digest")


def test_committed_manifest_is_the_pinned_one() -> None:
    """Rebuilding golden/tiny-dsv3 must update PINNED_MANIFESTS with it (else --pinned fails)."""
    import hashlib

    from harness.golden.integrity import PINNED_MANIFESTS
    from harness.golden.paths import default_bundle_path

    data = (default_bundle_path() / "manifest.json").read_bytes()
    assert hashlib.sha256(data).hexdigest() == PINNED_MANIFESTS[json.loads(data)["name"]]
