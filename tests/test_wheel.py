"""The wheel carries what an installed package needs to run the suite outside a checkout: the
suites, their xfails, the committed golden bundles and the JSON Schemas (issue #35: the wheel
lacked suites/ and the bundle, so `pip install <wheel>` could not run anything).

Built from a copy of the working tree (tracked and untracked, not ignored, files) (a build writes build/ and *.egg-info where it runs),
then unpacked and run from a folder outside the checkout with only the unpacked wheel on
PYTHONPATH ahead of the environment's own packages: the suites and the bundle must then be
found inside the package (harness/_bundled), never in this checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from harness.golden.pins import PINNED_MANIFESTS

ROOT = Path(__file__).resolve().parents[1]


def _tracked_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True,
                           check=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the wheel is built from the tracked files")
    tmp = tmp_path_factory.mktemp("wheel")
    src = _tracked_copy(tmp / "src")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(tmp / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (built,) = (tmp / "dist").glob("eagle3_conformance-*.whl")
    return built


@pytest.mark.slow(reason="builds the wheel (~10 s)")
def test_wheel_carries_the_suites_the_bundle_and_the_schemas(wheel: Path) -> None:
    """Slow (~30 s): a full wheel build of a 25 MB tree."""
    names = set(zipfile.ZipFile(wheel).namelist())
    suites = sorted(p.name for p in (ROOT / "suites").glob("*.py"))
    for name in suites:
        assert f"harness/_bundled/suites/{name}" in names, name
    for xf in (ROOT / "suites" / "xfails").iterdir():
        assert f"harness/_bundled/suites/xfails/{xf.name}" in names, xf.name
    for bundle in PINNED_MANIFESTS:  # every committed bundle, tiny-qwen3moe (issue #37) too
        manifest = json.loads((ROOT / "golden" / bundle / "manifest.json").read_text())
        for rel in ["manifest.json", *manifest["files"]]:
            assert f"harness/_bundled/golden/{bundle}/{rel}" in names, (bundle, rel)
    for kind in ("report", "certificate"):
        assert f"harness/schemas/{kind}.v1.schema.json" in names
    assert "harness/_bundled/build_info.json" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "eagle3-conformance = harness.cli:entry" in text and "harness.run.plugin" in text


@pytest.mark.slow(reason="builds the wheel and runs the suite from it outside the checkout (~10 s)")
def test_the_unpacked_wheel_runs_the_suite_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """Slow (~30 s): from a folder outside the checkout, the unpacked wheel first on
    PYTHONPATH runs three checks of the reference engine on its own bundled copy of the
    committed bundle, writes a certificate naming the pinned bundle, and verifies it."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("CI", None)

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "harness.cli", *argv], capture_output=True,
                              text=True, env=env, cwd=work, timeout=600, check=False)

    where = subprocess.run([sys.executable, "-c", "import harness.golden.paths as p; "
                            "print(p.suites_path()); print(p.default_bundle_path())"],
                           capture_output=True, text=True, env=env, cwd=work, check=True).stdout
    assert where.split() == [str(site / "harness" / "_bundled" / "suites"),
                             str(site / "harness" / "_bundled" / "golden" / "tiny-dsv3")]
    run = cli("run", "--engine", "reference", "--draft", "single-aux", "--profile", "dev",
              "--report-dir", "out", "-k", "test_draft_config or test_fc_output", "--", "-q",
              "-p", "no:cacheprovider")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    cert = json.loads((work / "out" / "certificate.json").read_text())
    assert cert["bundle"]["pinned"] is True
    assert cert["bundle"]["path"].startswith(str(site))
    assert cert["engine"]["adapter_path"].startswith(str(site))
    verify = cli("verify-certificate", "out/certificate.json", "--bundle",
                 str(site / "harness" / "_bundled" / "golden" / "tiny-dsv3"))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert (work / "out" / "badge.svg").is_file()
    # the second bundle by its name: outside a checkout the wheel's pinned copy
    qwen = cli("run", "--engine", "reference", "--bundle", "tiny-qwen3moe", "--draft",
               "single-aux", "--profile", "dev", "--report-dir", "out-qwen", "-k",
               "test_draft_config or test_fc_output", "--", "-q", "-p", "no:cacheprovider")
    assert qwen.returncode == 0, qwen.stdout[-2000:] + qwen.stderr[-2000:]
    cert = json.loads((work / "out-qwen" / "certificate.json").read_text())
    assert cert["bundle"]["pinned"] is True
    assert cert["bundle"]["path"] == str(site / "harness" / "_bundled" / "golden" / "tiny-qwen3moe")
