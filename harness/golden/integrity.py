"""Bundle integrity beyond "each file matches the hash its manifest claims".

A manifest is input: it must not make the suite open files outside the bundle (`../../etc`,
an absolute path, a symlink leading out). Every file must open as what it claims to be
(`golden verify` used to say OK for weights no loader could read). Values must be finite:
a NaN in the golden data or in a draft's weights would make every comparison pass. And a
manifest whose hashes were recomputed after tampering is self-consistent, so the committed
bundle's manifest digest is pinned here; `golden verify --pinned` compares against it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from harness.golden.pins import PINNED_MANIFESTS


def confined(root: Path, rel: object) -> str | None:
    """Why `rel` (a manifest path) is not a file inside `root`, or None when it is."""
    if not isinstance(rel, str) or not rel:
        return f"{rel!r} is not a relative path"
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or "\\" in rel:
        return f"{rel!r} points outside the bundle"
    try:
        (root / p).resolve().relative_to(root.resolve())
    except ValueError:
        return f"{rel!r} resolves outside the bundle (a symlink?)"
    except (RuntimeError, OSError):  # Path.resolve on a symlink loop (RuntimeError before 3.13)
        return f"{rel!r} is a symlink loop"
    return None


def weights_problem(state: Mapping[str, torch.Tensor], where: str) -> str | None:
    """One line on weights no trained model has: NaN/Inf anywhere, or an all-zero fc (a draft
    that ignores the target's features; every fc comparison of zeros with zeros passes)."""
    for name, t in state.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return (f"{where}: tensor {name!r} holds {bad} NaN/Inf values of {t.numel()}; "
                    f"re-export the weights from a clean checkpoint")
    fc = state.get("fc.weight")
    if fc is not None and fc.numel() and not bool(fc.any()):
        return (f"{where}: fc.weight is all zeros, so the draft ignores the target's features; "
                f"export the trained fc weights")
    return None


def open_problem(path: Path, rel: str) -> str | None:
    """Why a bundle file does not open as its kind (safetensors, JSON), or None."""
    try:
        if path.suffix == ".safetensors":
            return weights_problem(load_file(str(path)), rel)
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        else:
            path.read_bytes()
    except (SafetensorError, OSError, RuntimeError, ValueError, UnicodeDecodeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"bundle file {rel} cannot be opened ({first})"
    return None


def pinned_problem(name: str, manifest_path: Path) -> str | None:
    """Why this manifest is not the pinned one of bundle `name`, or None when it is."""
    want = PINNED_MANIFESTS.get(name)
    if want is None:
        return (f"no pinned digest for a bundle named {name!r} (pinned: "
                f"{', '.join(sorted(PINNED_MANIFESTS))}); drop --pinned for a bundle you built")
    got = hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    if got != want:
        return (f"{manifest_path} has sha256 {got[:16]}…, the committed {name} is pinned at "
                f"{want[:16]}…: the bundle was modified or rebuilt; restore it with "
                f"`git checkout golden/{name}`")
    return None
