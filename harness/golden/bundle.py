"""The golden bundle: a target, its drafts and the training-time tensors, hash-pinned.

A bundle is what the suite trusts, so loading it checks everything that can be checked
cheaply: the manifest's format version, that every listed file exists and matches its
sha256, that the tensors have the shapes the manifest promises. Each failure is one line
naming the problem and the fix, because the CLI prints it as it is.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from harness.core.config_schema import draft_config_problems, target_config_problems
from harness.golden.integrity import confined, open_problem

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TENSORS = "tensors.safetensors"
DEFAULT_BUNDLE_NAME = "tiny-dsv3"


class BundleError(ValueError):
    """A bundle that cannot be trusted; the message is one line with the fix."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class DraftSpec:
    """What training did for one draft: the ids in its convention and the boundaries they meant."""

    name: str
    folder: str
    convention: str
    layer_ids: tuple[int, ...]
    boundaries: tuple[int, ...]
    acc_k: tuple[float, ...]
    num_draft_tokens: int
    predicted_acceptance_length: float
    measured_acceptance_length: float


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]
    drafts: dict[str, DraftSpec]
    _tensors: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.manifest.get("name", self.path.name))

    @property
    def target_dir(self) -> Path:
        return self.path / self.manifest["target"]["folder"]

    @property
    def num_layers(self) -> int:
        return int(self.manifest["target"]["num_layers"])

    @property
    def hidden_size(self) -> int:
        return int(self.manifest["target"]["hidden_size"])

    @property
    def draft_names(self) -> list[str]:
        return list(self.drafts)

    def draft(self, name: str) -> DraftSpec:
        if name not in self.drafts:
            raise BundleError(f"bundle {self.path} has no draft {name!r}; "
                              f"choose one of {', '.join(self.drafts)}")
        return self.drafts[name]

    def draft_dir(self, name: str) -> Path:
        return self.path / self.draft(name).folder

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        if self._tensors is None:
            self._tensors = load_file(str(self.path / TENSORS))
        return self._tensors

    def prompts(self) -> list[list[int]]:
        """The pinned prompt set, unpadded."""
        ids, lengths = self.tensors["prompts.ids"], self.tensors["prompts.lengths"]
        return [ids[i, : int(n)].tolist() for i, n in enumerate(lengths)]

    def manifest_sha256(self) -> str:
        return sha256_file(self.path / MANIFEST)


_REQUIRED_TOP = ("format_version", "name", "target", "drafts", "prompts", "heldout", "files",
                 "versions")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise BundleError(message)


def load_bundle(path: str | Path, verify_hashes: bool = True) -> Bundle:
    root = Path(path)
    _need(root.is_dir(), f"bundle {root} does not exist or is not a folder; "
                         f"pass --bundle pointing at a golden/<name> folder")
    mpath = root / MANIFEST
    _need(mpath.is_file(), f"bundle {root} has no {MANIFEST}; rebuild it with "
                           f"`eagle3-conformance golden build --out {root}`")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{mpath} is not valid JSON ({e.msg if hasattr(e, 'msg') else e}); "
                          f"restore it from git or rebuild the bundle") from None
    _need(isinstance(manifest, dict), f"{mpath} must hold a JSON object; restore it or rebuild")
    missing = [k for k in _REQUIRED_TOP if k not in manifest]
    _need(not missing, f"{mpath} lacks {', '.join(missing)}; restore it or rebuild the bundle")
    version = manifest["format_version"]
    _need(version == FORMAT_VERSION,
          f"bundle format version {version!r} is not supported (this suite reads version "
          f"{FORMAT_VERSION}); rebuild the bundle with this version of eagle3-conformance")
    _check_manifest_types(manifest, mpath)
    files = manifest["files"]
    _need(isinstance(files, dict) and bool(files), f"{mpath}: 'files' must map every bundle file to its sha256; rebuild the bundle")
    for rel, digest in sorted(files.items()):
        outside = confined(root, rel)
        _need(outside is None, f"{mpath}: file {outside}; a manifest may only name files inside "
                               f"its bundle — restore it or rebuild the bundle")
        _need(isinstance(digest, str), f"{mpath}: the sha256 of {rel} is {digest!r}, not a hex "
                                       f"string; rebuild the bundle")
        fpath = root / rel
        _need(fpath.is_file(), f"bundle file {rel} is missing from {root}; "
                               f"restore it (git checkout) or rebuild the bundle")
        if verify_hashes:
            actual = sha256_file(fpath)
            _need(actual == digest, f"bundle file {rel} fails its sha256 check (manifest "
                                    f"{digest[:12]}…, file {actual[:12]}…); it was modified — "
                                    f"restore it or rebuild the bundle")
            problem = open_problem(fpath, rel) if rel != TENSORS else None
            _need(problem is None, f"{problem}; restore it or rebuild the bundle")
    for needed in (TENSORS, f"{manifest['target'].get('folder', 'target')}/config.json"):
        _need(needed in files, f"{mpath}: 'files' does not list {needed}; rebuild the bundle")
    drafts = {}
    for name, d in manifest["drafts"].items():
        try:
            drafts[name] = DraftSpec(
                name=name, folder=d["folder"], convention=d["convention"],
                layer_ids=tuple(d["layer_ids"]), boundaries=tuple(d["boundaries"]),
                acc_k=tuple(d["acc_k"]), num_draft_tokens=int(d["num_draft_tokens"]),
                predicted_acceptance_length=float(d["predicted_acceptance_length"]),
                measured_acceptance_length=float(d["measured_acceptance_length"]))
        except (KeyError, TypeError, ValueError) as e:
            raise BundleError(f"{mpath}: draft {name!r} entry is malformed ({e!r}); "
                              f"rebuild the bundle") from None
        _need(f"{d['folder']}/config.json" in files and f"{d['folder']}/model.safetensors" in files,
              f"{mpath}: draft {name!r} files are not listed; rebuild the bundle")
    _need(bool(drafts), f"{mpath} lists no drafts; rebuild the bundle")
    _check_configs(root, manifest, drafts)
    bundle = Bundle(root, manifest, drafts)
    _check_tensors(bundle)
    return bundle


def _check_manifest_types(manifest: dict[str, Any], mpath: Path) -> None:
    """The sections the loader indexes into have the types it indexes them as: a malformed
    manifest is bad input (one line), not a TypeError deep in the loader."""
    for key in ("target", "drafts", "prompts", "heldout", "files"):
        _need(isinstance(manifest[key], dict), f"{mpath}: {key!r} must be a JSON object, not "
                                               f"{type(manifest[key]).__name__}; restore or rebuild")
    for section, keys in (("target", ("num_layers", "hidden_size")),
                          ("prompts", ("count", "max_len", "continuation_len")),
                          ("heldout", ("prompts", "prompt_len"))):
        for k in keys:
            v = manifest[section].get(k)
            _need(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                  f"{mpath}: {section}.{k} is {v!r}, must be a positive integer; restore or rebuild")
    folder = manifest["target"].get("folder", "target")
    _need(confined(mpath.parent, folder) is None, f"{mpath}: target folder {folder!r} must be a "
                                                  f"folder inside the bundle; restore or rebuild")
    for name, d in manifest["drafts"].items():
        _need(isinstance(d, dict) and confined(mpath.parent, d.get("folder")) is None,
              f"{mpath}: draft {name!r} must be an object whose folder is inside the bundle; "
              f"restore or rebuild")
        problem = _served_tables_problem(d, int(manifest["heldout"]["prompts"]))
        _need(problem is None, f"{mpath}: draft {name!r}: {problem}; restore or rebuild the bundle")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)


def _served_tables_problem(draft: dict[str, Any], heldout: int) -> str | None:
    """The optional `wirings` and `canary` entries (what serving measured at build time),
    typed as `golden wirings` and the canary check read them, or why not."""
    rows = draft.get("wirings")
    if rows is not None:
        if not isinstance(rows, dict) or "served" not in rows:
            return f"'wirings' is {rows!r:.60}, must be an object with a 'served' row"
        for wiring, row in rows.items():
            if not (isinstance(row, dict) and _ints(row.get("boundaries"))
                    and _number(row.get("acceptance_length")) and _number(row.get("loss"))):
                return (f"wirings.{wiring} is {row!r:.60}, must hold integer 'boundaries' and "
                        f"finite 'acceptance_length' and 'loss'")
    canary = draft.get("canary")
    if canary is not None:
        if not isinstance(canary, dict):
            return f"'canary' is {canary!r:.60}, must be an object"
        for key in ("served", "best_wrong", "threshold"):
            if not _number(canary.get(key)):
                return f"canary.{key} is {canary.get(key)!r:.40}, must be a finite number"
        if not isinstance(canary.get("best_wrong_wiring"), str):
            return f"canary.best_wrong_wiring is {canary.get('best_wrong_wiring')!r:.40}, must be a string"
        prompts = canary.get("prompts")
        if not (_ints(prompts) and prompts and all(0 <= i < heldout for i in prompts)):
            return (f"canary.prompts is {prompts!r:.60}, must be a non-empty list of held-out "
                    f"prompt indices 0..{heldout - 1}")
    return None


def _check_configs(root: Path, manifest: dict[str, Any], drafts: dict[str, DraftSpec]) -> None:
    """Draft and target configs typed as the engines read them (see harness.core.config_schema)."""
    folder = manifest["target"].get("folder", "target")
    configs = [(f"{folder}/config.json", target_config_problems)]
    configs += [(f"{spec.folder}/config.json", draft_config_problems) for spec in drafts.values()]
    for rel, problems_of in configs:
        try:
            cfg = json.loads((root / rel).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise BundleError(f"bundle file {rel} cannot be read ({e}); restore or rebuild") from None
        problems = problems_of(cfg)
        _need(not problems, f"bundle file {rel}: {problems[0][0] if problems else ''} "
                            f"{problems[0][1] if problems else ''}; restore it or rebuild the bundle")


def _check_tensors(bundle: Bundle) -> None:
    try:
        t = bundle.tensors
    except (SafetensorError, OSError, RuntimeError) as e:
        raise BundleError(f"{TENSORS} in {bundle.path} cannot be read ({str(e).splitlines()[0]}); "
                          f"restore it or rebuild the bundle") from None
    m = bundle.manifest
    n_layers, hidden = bundle.num_layers, bundle.hidden_size
    p, max_len = int(m["prompts"]["count"]), int(m["prompts"]["max_len"])
    gen = int(m["prompts"]["continuation_len"])
    expect: dict[str, tuple[int, ...]] = {
        "prompts.ids": (p, max_len),
        "prompts.lengths": (p,),
        "boundaries": (p, n_layers + 1, max_len, hidden),
        "final_normed": (p, max_len, hidden),
        "mlp_out": (p, n_layers + 1, max_len, hidden),
        "continuations": (p, gen),
        "heldout.ids": (int(m["heldout"]["prompts"]), int(m["heldout"]["prompt_len"])),
    }
    for name, spec in bundle.drafts.items():
        n = len(spec.boundaries)
        expect[f"{name}.aux"] = (p, max_len, n * hidden)
        expect[f"{name}.fc"] = (p, max_len, -1)
        expect[f"{name}.draft_tokens"] = (p, max_len, -1)
        expect[f"{name}.accept_trace"] = (p, -1)
    for key, shape in expect.items():
        _need(key in t, f"{TENSORS} lacks tensor {key!r}; rebuild the bundle")
        actual = tuple(t[key].shape)
        ok = len(actual) == len(shape) and all(s in (-1, a) for s, a in zip(shape, actual, strict=True))
        _need(ok, f"tensor {key!r} has shape {list(actual)}, the manifest implies "
                  f"{[s if s >= 0 else '*' for s in shape]}; rebuild the bundle")
    for key in sorted(t):
        if t[key].is_floating_point() and not bool(torch.isfinite(t[key]).all()):
            raise BundleError(f"golden tensor {key!r} in {TENSORS} holds NaN or Inf; every "
                              f"comparison against it would pass — rebuild the bundle")
    lengths = t["prompts.lengths"]
    _need(bool((lengths >= 1).all() and (lengths <= max_len).all()),
          f"prompts.lengths out of range 1..{max_len}; rebuild the bundle")


def bundle_differences(first: Bundle, second: Bundle) -> list[str]:
    """What differs between two bundles, file by file and in the recorded figures: the check
    that a rebuild reproduced a bundle (same seed, same machine, same thread count)."""
    out: list[str] = []
    fa, fb = first.manifest["files"], second.manifest["files"]
    for rel in sorted(set(fa) | set(fb)):
        if rel not in fa or rel not in fb:
            out.append(f"{rel}: only in {first.path if rel in fa else second.path}")
        elif fa[rel] != fb[rel]:
            out.append(f"{rel}: sha256 {fa[rel][:12]} != {fb[rel][:12]}")
    for key in ("seed", "threads", "target_threads", "target", "drafts", "prompts", "heldout"):
        if first.manifest.get(key) != second.manifest.get(key):
            out.append(f"manifest {key!r} differs")
    return out
