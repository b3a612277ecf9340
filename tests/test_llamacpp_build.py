"""scripts/build_llamacpp.sh on a stand-in for llama.cpp's sources (issue #34 item 6): the build
is a unity build where it compiles as one, and a tree that does not (here two sources define the
same function, as ggml-cpu's do in batches of 16) is built again file by file, saying why, with
both outputs where the adapter looks (EAGLE3_LLAMACPP_SRC / EAGLE3_LLAMACPP_BUILD, the
adapter's own variables). The real llama.cpp's unity build is what `scripts/test.sh` builds and
every llama.cpp test runs on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                                reason="cmake or a C++ compiler is missing: scripts/build_llamacpp.sh cannot run here")

CMAKE = """cmake_minimum_required(VERSION 3.14)
project(standin CXX)
add_library(llama SHARED a.cpp b.cpp)
add_executable(llama-server main.cpp)
target_link_libraries(llama-server llama)
set_target_properties(llama llama-server PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
"""


def _build(tmp_path: Path, clash: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(CMAKE)
    helper = "static int helper() { return %d; }\n"
    (src / "a.cpp").write_text((helper % 1 if clash else "") + "int a() { return %s; }\n" % ("helper()" if clash else "1"))
    (src / "b.cpp").write_text((helper % 2 if clash else "") + "int b() { return %s; }\n" % ("helper()" if clash else "2"))
    (src / "main.cpp").write_text("int a(); int b();\nint main() { return a() + b() == 3 ? 0 : 1; }\n")
    env = dict(os.environ, EAGLE3_LLAMACPP_SRC=str(src), EAGLE3_LLAMACPP_BUILD=str(build),
               LLAMACPP_BUILD_JOBS="1")
    run = subprocess.run(["bash", str(ROOT / "scripts" / "build_llamacpp.sh")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    return run, build


def _is_unity(build: Path) -> bool:
    return any(build.rglob("unity_*_cxx.cxx"))


@pytest.mark.parametrize("clash", [False, True], ids=["compiles-as-one", "clashes-as-one"])
def test_unity_build_or_file_by_file_saying_why(tmp_path: Path, clash: bool) -> None:
    run, build = _build(tmp_path, clash)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert (build / "bin" / "libllama.so").is_file() and os.access(build / "bin" / "llama-server", os.X_OK)
    assert subprocess.run([str(build / "bin" / "llama-server")], check=False).returncode == 0
    said = "does not build as a unity build" in run.stderr
    assert said == clash, run.stderr[-2000:]
    assert _is_unity(build) != clash, sorted(p.name for p in build.rglob("*.cxx"))
    if clash:
        assert "helper" in run.stderr, "the failing unity build's end is shown"


def test_serving_plumbing_at_O0_compute_at_O3(tmp_path: Path) -> None:
    """scripts/llamacpp_build.cmake compiles the server side (here the stand-in's llama-server)
    at -O0, after Release's -O3 so that it wins, and leaves the library that computes (llama)
    at -O3: a third of the build's CPU on 2 cores, no runtime cost seen on the tiny bundles
    (its header). In the unity build and the file-by-file fallback alike."""
    for clash in (False, True):
        (tmp_path / str(clash)).mkdir()
        run, build = _build(tmp_path / str(clash), clash)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        flags = {t: (build / "CMakeFiles" / f"{t}.dir" / "flags.make").read_text()
                 for t in ("llama", "llama-server")}
        server = flags["llama-server"].split("CXX_FLAGS =", 1)[1].splitlines()[0].split()
        assert "-O3" in server and server.index("-O0") > server.index("-O3"), server
        assert "-O0" not in flags["llama"] and "-O3" in flags["llama"], flags["llama"]
