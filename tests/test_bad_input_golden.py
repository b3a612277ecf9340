"""Bad bundles and bad `golden` arguments, round two: malformed `wirings`/`canary` manifest
entries, drafts that fail the draft lint, path arguments that are empty, loops or files, and
the pin of the committed bundle. Each is refused by `run` (with no report left behind) and
by `golden verify`/`wirings`: exit 2, one `error:` line. Before: exit 3 (wirings, canary),
a "nonconformant" verdict (a draft failing lint: a bad bundle is no finding about the
engine), or a certification of a tampered committed bundle whose hashes were recomputed."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bad_input import edit_json, refused, seed_stale_report, symlink_loop, tampered

from harness import cli
from harness.golden import integrity

DRAFT = "single-aux"


def _entry(change: Callable[[dict], Any], draft: str = DRAFT) -> Callable[[Path], None]:
    return lambda b: edit_json(b / "manifest.json", lambda m: change(m["drafts"][draft]))


def _canary(**values: Any) -> Callable[[Path], None]:
    return _entry(lambda d: d["canary"].update(values))


def _served(**values: Any) -> Callable[[Path], None]:
    return _entry(lambda d: d["wirings"]["served"].update(values))


MANIFEST: dict[str, tuple[Callable[[Path], None], str]] = {
    "wirings-a-list": (_entry(lambda d: d.update(wirings=[1])), "'wirings' is [1]"),
    "wirings-no-served-row": (_entry(lambda d: d["wirings"].pop("served")), "with a 'served' row"),
    "wirings-row-a-number": (_entry(lambda d: d["wirings"].update(served=3)), "wirings.served is 3"),
    "wirings-boundaries-strings": (_served(boundaries=["2", "4"]), "wirings.served is"),
    "wirings-acceptance-null": (_served(acceptance_length=None), "finite 'acceptance_length'"),
    "wirings-loss-a-bool": (_served(loss=True), "wirings.served is"),
    "canary-a-string": (_entry(lambda d: d.update(canary="x")), "'canary' is 'x'"),
    "canary-threshold-null": (_canary(threshold=None), "canary.threshold is None"),
    "canary-served-a-string": (_canary(served="4.3"), "canary.served is '4.3'"),
    "canary-best-wrong-nan": (_canary(best_wrong=float("nan")), "canary.best_wrong is nan"),
    "canary-wiring-a-number": (_canary(best_wrong_wiring=3), "canary.best_wrong_wiring is 3"),
    "canary-prompts-empty": (_canary(prompts=[]), "canary.prompts is []"),
    "canary-prompt-out-of-range": (_canary(prompts=[0, 10_000]), "held-out prompt indices"),
    "canary-prompt-a-bool": (_canary(prompts=[True]), "canary.prompts is [True]"),
}


def _draft_cfg(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    return lambda b: edit_json(b / f"draft-{DRAFT}" / "config.json", change)


LINT: dict[str, tuple[Callable[[Path], None], str]] = {
    "architecture-eagle-not-eagle3": (_draft_cfg(lambda c: c.update(architectures=["LlamaForCausalLMEagle"])),
                                      "architectures: is ['LlamaForCausalLMEagle']"),
    "aux-hidden-state-off": (_draft_cfg(lambda c: c["eagle_config"].update(use_aux_hidden_state=False)),
                             "use_aux_hidden_state: is false"),
    "id-past-the-target": (_draft_cfg(lambda c: c["eagle_config"].update(
        eagle_aux_hidden_state_layer_ids=[99])), "id 99 is past the last boundary"),
    "hidden-size-not-the-weights": (_draft_cfg(lambda c: c.update(hidden_size=32)), "fc.weight: has shape"),
    "draft-vocab-not-the-head": (_draft_cfg(lambda c: c.update(draft_vocab_size=7)), "draft_vocab_size 7"),
    "vocab-not-the-targets": (_draft_cfg(lambda c: c.update(vocab_size=7)), "vocab_size: is 7"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST) + sorted(LINT))
def test_bad_bundle_round_two(case: str, smoke_bundle: Path, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    change, needle = MANIFEST.get(case) or LINT[case]
    bad = tampered(smoke_bundle, tmp_path / "bad", change)
    out = seed_stale_report(tmp_path / "out")
    line = refused(["run", "--bundle", str(bad), "--report-dir", str(out)], capsys, needle, out)
    if case in LINT:
        assert f"draft {DRAFT} fails the draft lint" in line
    refused(["golden", "verify", str(bad)], capsys, needle)
    refused(["golden", "wirings", str(bad)], capsys, needle)


@pytest.mark.parametrize("argv, needle", [
    (["golden", "verify", ""], "PATH is empty"),
    (["golden", "wirings", ""], "PATH is empty"),
    (["golden", "verify", "/no/such/bundle"], "PATH /no/such/bundle does not exist"),
    (["golden", "diff", "", "x"], "FIRST is empty"),
])
def test_bad_golden_path(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused(argv, capsys, needle)


def test_golden_paths_that_are_loops_or_files(smoke_bundle: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    loop = symlink_loop(tmp_path)
    afile = tmp_path / "bundle.tar"
    afile.write_text("")
    refused(["golden", "verify", str(loop)], capsys, "PATH")
    refused(["golden", "diff", str(smoke_bundle), str(loop)], capsys, "SECOND")
    refused(["golden", "verify", str(afile)], capsys, "is not a folder")
    refused(["golden", "wirings", str(afile)], capsys, "is not a folder")


def test_a_file_in_the_bundle_that_is_a_symlink_loop(smoke_bundle: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Path.resolve raised RuntimeError on it (exit 3): now the manifest names a loop."""
    bad = tampered(smoke_bundle, tmp_path / "bad", lambda b: None)
    gen = bad / "target" / "generation_config.json"
    gen.unlink()
    gen.symlink_to(gen)
    refused(["golden", "verify", str(bad)], capsys, "is a symlink loop")
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--bundle", str(bad), "--report-dir", str(out)], capsys, "is a symlink loop", out)


def _as_committed(bundle: Path, monkeypatch: pytest.MonkeyPatch, pinned_from: Path) -> None:
    """Make `bundle` the checkout's committed bundle, pinned at `pinned_from`'s manifest."""
    import harness.golden.paths

    monkeypatch.setattr(harness.golden.paths, "default_bundle_path", lambda: bundle)
    digest = hashlib.sha256((pinned_from / "manifest.json").read_bytes()).hexdigest()
    monkeypatch.setitem(integrity.PINNED_MANIFESTS, json.loads((pinned_from / "manifest.json").read_text())["name"],
                        digest)


def test_run_checks_the_pin_of_the_committed_bundle(smoke_bundle: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's tamper: fc weights scaled by 1.5, every hash recomputed. Self-consistent,
    so only the pin tells; `run` on the committed bundle checks it without being asked."""
    from safetensors.torch import load_file, save_file

    def scale_fc(b: Path) -> None:
        path = b / f"draft-{DRAFT}" / "model.safetensors"
        state = load_file(str(path))
        state["fc.weight"] = state["fc.weight"] * 1.5
        save_file(state, str(path))

    bad = tampered(smoke_bundle, tmp_path / "committed", scale_fc)
    _as_committed(bad, monkeypatch, smoke_bundle)
    out = seed_stale_report(tmp_path / "out")
    refused(["run", "--report-dir", str(out)], capsys, "the committed bundle fails its pin", out)
    refused(["run", "--bundle", str(bad), "--report-dir", str(out)], capsys, "fails its pin", out)
    root = tmp_path / "st"
    refused(["selftest", "--report-dir", str(root), "--no-control", "--mutant", "ids_plus_one"],
            capsys, "fails its pin")
    refused(["golden", "verify", "--pinned", str(bad)], capsys, "pinned at")
    assert cli.main(["golden", "diff", str(bad), str(smoke_bundle)]) == 1  # shows what changed


def test_the_untampered_committed_bundle_passes_its_pin(smoke_bundle: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The control of the case above: the same copy, unchanged, is accepted."""
    good = tampered(smoke_bundle, tmp_path / "committed", lambda b: None)
    _as_committed(good, monkeypatch, smoke_bundle)
    assert cli.main(["golden", "verify", str(good)]) == 0


def test_a_user_bundle_is_reported_unpinned(smoke_bundle: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A bundle the user built has no pin: certified against, and called unpinned in
    report.json (`bundle.pinned`), report.md and the verdict line."""
    out = tmp_path / "out"
    bundle = tmp_path / "smoke"  # a private copy: other tests may alter the shared one
    shutil.copytree(smoke_bundle, bundle)
    code = cli.main(["run", "--bundle", str(bundle), "--report-dir", str(out), "--draft", DRAFT,
                     "-k", "test_draft_config", "--", "-q", "-p", "no:cacheprovider"])
    captured = capsys.readouterr()
    assert (out / "report.json").is_file(), (code, captured.err[-1500:], captured.out[-1500:])
    verdict = captured.out.strip().splitlines()[-1]
    report = json.loads((out / "report.json").read_text())
    assert report["bundle"]["pinned"] is False
    assert "bundle smoke is unpinned" in verdict, verdict
    assert "**unpinned**" in (out / "report.md").read_text()
