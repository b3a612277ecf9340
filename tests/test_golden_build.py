"""`golden build` is deterministic for a seed on one machine at one thread count: the promise
that makes the committed bundle reviewable (anyone can rebuild it and diff). The `smoke` size
runs every stage of the real builder (corpus, target training, regeneration, vocab mapping,
TTT draft training, pinned tensors, simulated acceptance, manifest) on a sliver of data, so
two builds fit in a unit test; the full-size rebuild is the same code with bigger numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.golden.builder import BUILD_SIZES, build_bundle, draft_recipes
from harness.golden.bundle import bundle_differences, load_bundle, sha256_file
from harness.paths import default_bundle_path


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("builds")
    quiet = lambda _: None  # noqa: E731
    a = build_bundle(root / "a" / "smoke", seed=3, size=BUILD_SIZES["smoke"], log=quiet)
    b = build_bundle(root / "b" / "smoke", seed=3, size=BUILD_SIZES["smoke"], log=quiet)
    return a, b


def test_same_seed_builds_hash_identically(two_builds: tuple[Path, Path]) -> None:
    a, b = (load_bundle(p) for p in two_builds)
    diffs = bundle_differences(a, b)
    assert not diffs, "two builds with seed 3 differ:\n" + "\n".join(diffs)
    # target weights + config + training.json, tensors, and weights + config of every draft
    assert len(a.manifest["files"]) >= 4 + 2 * len(a.draft_names), a.manifest["files"]


def test_builds_every_recipe(two_builds: tuple[Path, Path]) -> None:
    bundle = load_bundle(two_builds[0])
    recipes = draft_recipes(bundle.num_layers)
    assert set(bundle.draft_names) == {r.name for r in recipes}
    for r in recipes:
        assert tuple(bundle.manifest["drafts"][r.name]["boundaries"]) == r.boundaries


def test_differences_name_the_changed_file(two_builds: tuple[Path, Path], tmp_path: Path) -> None:
    """Guards the comparison itself: a one-byte change in one draft is reported by name."""
    a = two_builds[0]
    c = tmp_path / "smoke"
    shutil.copytree(a, c)
    rel = next(r for r in json.loads((a / "manifest.json").read_text())["files"]
               if r.endswith("config.json") and r.startswith("draft-"))
    cfg = json.loads((c / rel).read_text())
    cfg["rms_norm_eps"] = 1e-5 if cfg.get("rms_norm_eps") != 1e-5 else 1e-6
    (c / rel).write_text(json.dumps(cfg))
    m = json.loads((c / "manifest.json").read_text())
    m["files"][rel] = sha256_file(c / rel)
    (c / "manifest.json").write_text(json.dumps(m))
    diffs = bundle_differences(load_bundle(a), load_bundle(c))
    assert diffs == [f"{rel}: sha256 {sha256_file(a / rel)[:12]} != {sha256_file(c / rel)[:12]}"]


def test_cli_diff_exit_codes(two_builds: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_builds
    assert cli.main(["golden", "diff", str(a), str(b)]) == 0
    assert "identical" in capsys.readouterr().out
    assert cli.main(["golden", "diff", str(a), str(default_bundle_path())]) == 1
    assert "difference(s)" in capsys.readouterr().out


def test_committed_bundle_was_built_at_one_thread_setting() -> None:
    """A target trained at another thread count than the drafts cannot be rebuilt by one
    `golden build` command; the manifest must say the whole bundle came from one."""
    m = load_bundle(default_bundle_path(), verify_hashes=False).manifest
    assert m.get("build") == json.loads(json.dumps(BUILD_SIZES["full"].__dict__)), m.get("build")
    assert m["threads"] == m["target_threads"], (m["threads"], m["target_threads"])
