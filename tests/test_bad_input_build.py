"""`golden build --out` deletes or overwrites nothing it did not create, and says so before
any training (a refusal after 40 minutes of training is no refusal)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from bad_input import refused

from harness.golden import builder


@pytest.fixture(autouse=True)
def _no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused build must stop before training: training here fails the test."""
    def train(*args: object, **kwargs: object) -> None:
        raise AssertionError("training started before --out was checked")
    monkeypatch.setattr(builder, "train_target", train)


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    return folder


def test_refuses_a_non_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _user_folder(tmp_path)
    start = time.monotonic()
    refused(["golden", "build", "--out", str(folder), "--size", "smoke"], capsys,
            "non-empty folder that is not a bundle this builder wrote")
    assert (folder / "thesis.tex").read_text() == "years of work"
    assert time.monotonic() - start < 10


def test_refuses_the_working_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = _user_folder(tmp_path)
    monkeypatch.chdir(folder)
    refused(["golden", "build", "--out", ".", "--size", "smoke"], capsys, "--out . is a non-empty")
    assert (folder / "thesis.tex").exists()


def test_refuses_an_existing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bundle.tar"
    f.write_text("keep")
    refused(["golden", "build", "--out", str(f), "--size", "smoke"], capsys,
            "exists and is not a folder")
    assert f.read_text() == "keep"


def test_refuses_a_symlink(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = _user_folder(tmp_path)
    link = tmp_path / "link"
    os.symlink(target, link)
    refused(["golden", "build", "--out", str(link), "--size", "smoke"], capsys, "is not a folder")
    assert (target / "thesis.tex").exists()


@pytest.mark.slow(reason="builds a smoke bundle (~10 s)")
def test_refuses_a_bundle_with_a_user_file_added(smoke_bundle: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "smoke"
    shutil.copytree(smoke_bundle, copy)
    (copy / "my-notes.txt").write_text("mine")
    refused(["golden", "build", "--out", str(copy), "--size", "smoke"], capsys, "non-empty folder")
    assert (copy / "my-notes.txt").exists()


def test_refuses_an_unwritable_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    refused(["golden", "build", "--out", str(blocker / "sub" / "b"), "--size", "smoke"], capsys,
            "cannot create it")


def test_accepts_what_it_may_replace(smoke_bundle: Path, tmp_path: Path) -> None:
    """The control: a new path, an empty folder and a bundle this builder wrote are fine."""
    (tmp_path / "empty").mkdir()
    for ok in (tmp_path / "new" / "b", tmp_path / "empty", smoke_bundle):
        assert builder.out_problem(ok) is None, ok
