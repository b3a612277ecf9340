"""The golden bundle loader: the committed bundle is valid, and every corruption is rejected
with one line that names the problem and the fix."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from harness.golden.bundle import BundleError, load_bundle, sha256_file
from harness.golden.paths import default_bundle_path

BUNDLE = default_bundle_path()


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(BUNDLE, dst)
    return dst


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _write_manifest(root: Path, m: dict) -> None:
    (root / "manifest.json").write_text(json.dumps(m))


def _rehash(root: Path, rel: str) -> None:
    m = _manifest(root)
    m["files"][rel] = sha256_file(root / rel)
    _write_manifest(root, m)


def _edit_tensors(root: Path, edit: Callable[[dict], None]) -> None:
    t = load_file(str(root / "tensors.safetensors"))
    edit(t)
    save_file(t, str(root / "tensors.safetensors"))
    _rehash(root, "tensors.safetensors")


def test_committed_bundle_is_valid() -> None:
    b = load_bundle(BUNDLE)
    assert b.num_layers == 8 and len(b.drafts) >= 2
    assert {0} <= {bb for d in b.drafts.values() for bb in d.boundaries}, "no draft exercises the embedding"
    total = sum(p.stat().st_size for p in BUNDLE.rglob("*") if p.is_file())
    assert total < 25 * 2**20, f"bundle is {total / 2**20:.1f} MiB, over the 25 MB budget"


def _m(key: str, value) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        m = _manifest(root)
        m[key] = value
        _write_manifest(root, m)
    return corrupt


def _drop(key: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        m = _manifest(root)
        del m[key]
        _write_manifest(root, m)
    return corrupt


def _draft_field(field: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        m = _manifest(root)
        del next(iter(m["drafts"].values()))[field]
        _write_manifest(root, m)
    return corrupt


def _flip_byte(rel: str) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        data = bytearray((root / rel).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / rel).write_bytes(bytes(data))
    return corrupt


def _truncate_tensors(root: Path) -> None:
    p = root / "tensors.safetensors"
    p.write_bytes(p.read_bytes()[:1000])
    _rehash(root, "tensors.safetensors")


def _reshape_boundaries(root: Path) -> None:
    _edit_tensors(root, lambda t: t.__setitem__("boundaries", t["boundaries"][:, :-1].contiguous()))


def _drop_tensor(root: Path) -> None:
    _edit_tensors(root, lambda t: t.pop("mlp_out"))


def _bad_lengths(root: Path) -> None:
    _edit_tensors(root, lambda t: t["prompts.lengths"].__setitem__(0, 0))


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "manifest missing": (lambda r: (r / "manifest.json").unlink(), "no manifest.json"),
    "manifest not json": (lambda r: (r / "manifest.json").write_text("{oops"), "not valid JSON"),
    "manifest not an object": (lambda r: (r / "manifest.json").write_text("[1, 2]"), "JSON object"),
    "required key missing": (_drop("drafts"), "lacks drafts"),
    "unknown format version": (_m("format_version", 99), "format version 99"),
    "files map empty": (_m("files", {}), "'files'"),
    "drafts empty": (_m("drafts", {}), "no drafts"),
    "draft entry malformed": (_draft_field("layer_ids"), "malformed"),
    "listed file missing": (lambda r: (r / "target" / "model.safetensors").unlink(), "is missing"),
    "hash mismatch (weights)": (_flip_byte("target/model.safetensors"), "sha256"),
    "hash mismatch (draft config)": (_flip_byte("draft-specforge-default/config.json"), "sha256"),
    "tensors unreadable": (_truncate_tensors, "cannot be read"),
    "tensor wrong shape": (_reshape_boundaries, "has shape"),
    "tensor missing": (_drop_tensor, "lacks tensor 'mlp_out'"),
    "prompt lengths out of range": (_bad_lengths, "prompts.lengths"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_is_rejected_with_one_line(copy: Path, name: str) -> None:
    corrupt, phrase = CORRUPTIONS[name]
    corrupt(copy)
    with pytest.raises(BundleError) as info:
        load_bundle(copy)
    message = str(info.value)
    assert "\n" not in message, f"multi-line error for {name}: {message!r}"
    assert phrase in message, f"{name}: expected {phrase!r} in {message!r}"
    assert ";" in message, f"{name}: the message names no fix: {message!r}"


def test_missing_bundle_folder(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nowhere")
