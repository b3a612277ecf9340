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
    assert m.get("build") == json.loads(json.dumps(BUILD_SIZES["full"].record())), m.get("build")
    assert m["threads"] == m["target_threads"], (m["threads"], m["target_threads"])


def test_a_target_that_learned_nothing_is_refused_before_the_drafts(tmp_path: Path) -> None:
    """A usable build refuses a stalled target at once, in one line naming the numbers and the
    way out, and writes nothing (measured: a from-scratch full build on the 2026-12-02 CI
    machine stalled at loss 4.763, accuracy 0.042, and went on to write drafts that accept
    everything under every wiring). Three target steps stall for sure; the smoke size is the
    same recipe with the check off, so only `require_usable` differs."""
    from dataclasses import replace

    out = tmp_path / "refused"
    with pytest.raises(ValueError, match="the target did not learn the language") as err:
        build_bundle(out, seed=0, size=replace(BUILD_SIZES["smoke"], require_usable=True), log=lambda _: None)
    assert "bigram" in str(err.value) and "--target-from" in str(err.value) and "\n" not in str(err.value)
    assert not out.exists() and not list(tmp_path.glob(".golden-*"))


def test_usability_bars_on_the_measured_figures() -> None:
    """The bars on the figures they were set against: the committed target (0.517) clears the
    bigram table's 0.377 on its language; the stalled one (0.042) does not; a canary whose best
    wrong wiring accepts as much as the served one is refused, the committed one is not."""
    from harness.golden.builder import canary_problem, target_problem
    from harness.golden.corpus import make_language
    from harness.golden.training import bigram_accuracy

    manifest = json.loads((default_bundle_path() / "manifest.json").read_text())
    bigram = bigram_accuracy(make_language(manifest["seed"]), manifest["seed"])
    assert 0.2 < bigram < manifest["target"]["heldout_next_token_accuracy"]
    assert target_problem(manifest["target"]["heldout_next_token_accuracy"], 1.42, bigram) is None
    assert "stalled" in target_problem(0.0419, 4.763, bigram)
    for name, meta in manifest["drafts"].items():
        assert canary_problem(name, meta["canary"]) is None
    flat = {"served": 5.0, "best_wrong": 5.0, "best_wrong_wiring": "slots_minus_one"}
    assert "could not tell a wrong wiring" in canary_problem("x", flat)
