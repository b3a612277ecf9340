#!/usr/bin/env bash
# llama.cpp built from the registry's sources (issue #37): the engine the `llamacpp`
# adapter drives. Fetches the sources (scripts/fetch_llamacpp.sh), then a CPU build of
# libllama (shared: the adapter binds it with ctypes for llama_set_embeddings_layer_inp)
# and llama-server (greedy speculative decoding with --spec-type draft-eagle3) into
# .llamacpp/<version>/build, a folder git ignores, keyed by version: a second call finds
# both outputs and does nothing. GGML_NATIVE=OFF so a cached build runs on any x86-64
# (CI runners differ from the machine that built it). Measured on 2 shared cores with -j2:
# ~15 s fetch, 555 s build (issue #37, measured 2026-12-05; 310 s on an idle 2-core machine,
# 2026-12-06; file by file then, a unity build now: below). LLAMA_USE_PREBUILT_UI=OFF: the server's web UI (the adapter runs it --no-webui) is
# not downloaded at build time; without it the build tried huggingface.co and failed over on
# DNS, a network call a CI without internet must not depend on (it now embeds 0 UI assets).
# Usage: scripts/build_llamacpp.sh [version]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-11434.0.0}"
jobs="${LLAMACPP_BUILD_JOBS:-2}"
# EAGLE3_LLAMACPP_SRC / EAGLE3_LLAMACPP_BUILD: other sources and build folder, the adapter's own
# variables (harness/engines/llamacpp.py), so it finds what was built there
src="${EAGLE3_LLAMACPP_SRC:-.llamacpp/$version/src}"
build="${EAGLE3_LLAMACPP_BUILD:-.llamacpp/$version/build}"
lib="$build/bin/libllama.so"
server="$build/bin/llama-server"
if [ -f "$lib" ] && [ -x "$server" ]; then
    exit 0
fi
[ -n "${EAGLE3_LLAMACPP_SRC:-}" ] || bash scripts/fetch_llamacpp.sh "$version"
# A unity build (issue #34 item 6): each target's sources compiled a batch at a time (CMake's
# default of 8), so the headers all of them include are parsed once per batch. Measured from
# scratch on the idle 2-core machine (2026-12-07, -j2): 250 s and 415 s of CPU, against 341 s and
# 648 s file by file; the llama.cpp unit tests and both suite runs gave the same verdicts. It
# needs CMake >= 3.19 (scripts/llamacpp_build.cmake keeps two mtmd sources apart; it also compiles
# the server, common and mtmd at -O0, the compute at -O3: its header says why). Where CMake is
# older, or a llama.cpp version does not compile as a unity build (batches of 16 do not: ggml-cpu
# defines nearest_int twice), the build is done again file by file, saying why.
configure() {  # extra cmake arguments
    cmake -S "$src" -B "$build" "$@" \
        "-DCMAKE_PROJECT_INCLUDE=$PWD/scripts/llamacpp_build.cmake" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_CURL=OFF \
        -DGGML_NATIVE=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log" >&2; exit 1; }
}
start=$(date +%s)
unity_built=false
cmake_version="$(cmake --version | head -n 1 | awk '{print $3}')"
if [ "$(printf '%s\n' 3.19 "$cmake_version" | sort -V | head -n 1)" != 3.19 ]; then
    echo "CMake $cmake_version is older than 3.19: llama.cpp is built file by file (slower)" >&2
else
    configure -DCMAKE_UNITY_BUILD=ON
    if cmake --build "$build" --target llama llama-server -j "$jobs" >"$build.unity.log" 2>&1; then
        unity_built=true
        tail -n 2 "$build.unity.log"
    else
        tail -n 20 "$build.unity.log" >&2
        echo "llama.cpp $version does not build as a unity build (its log: $build.unity.log, the end above): building file by file" >&2
        # CMake's own folders only (cache, objects, unity sources): $build may be a folder the
        # user named (EAGLE3_LLAMACPP_BUILD), whose other files stay
        rm -f "$build/CMakeCache.txt"
        find "$build" -type d -name CMakeFiles -prune -exec rm -rf {} +
    fi
fi
if [ "$unity_built" = false ]; then
    configure
    cmake --build "$build" --target llama llama-server -j "$jobs"
fi
test -f "$lib" || lib_found=$(find "$build" -name 'libllama.so' | head -1)
if [ ! -f "$lib" ]; then
    echo "libllama.so not at $lib (found: ${lib_found:-none})" >&2
    exit 1
fi
echo "llama.cpp $version built in $(( $(date +%s) - start )) s: $build"
