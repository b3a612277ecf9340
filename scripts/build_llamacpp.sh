#!/usr/bin/env bash
# llama.cpp built from the registry's sources (issue #37): the engine the `llamacpp`
# adapter drives. Fetches the sources (scripts/fetch_llamacpp.sh), then a CPU build of
# libllama (shared: the adapter binds it with ctypes for llama_set_embeddings_layer_inp)
# and llama-server (greedy speculative decoding with --spec-type draft-eagle3) into
# .llamacpp/<version>/build, a folder git ignores, keyed by version: a second call finds
# both outputs and does nothing. GGML_NATIVE=OFF so a cached build runs on any x86-64
# (CI runners differ from the machine that built it). Measured on 2 shared cores with -j2:
# ~15 s fetch, 555 s build (issue #37, measured 2026-12-05; 310 s on an idle 2-core machine,
# 2026-12-06). LLAMA_USE_PREBUILT_UI=OFF: the server's web UI (the adapter runs it --no-webui) is
# not downloaded at build time; without it the build tried huggingface.co and failed over on
# DNS, a network call a CI without internet must not depend on (it now embeds 0 UI assets).
# Usage: scripts/build_llamacpp.sh [version]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-11434.0.0}"
jobs="${LLAMACPP_BUILD_JOBS:-2}"
src=".llamacpp/$version/src"
build=".llamacpp/$version/build"
lib="$build/bin/libllama.so"
server="$build/bin/llama-server"
if [ -f "$lib" ] && [ -x "$server" ]; then
    exit 0
fi
bash scripts/fetch_llamacpp.sh "$version"
start=$(date +%s)
cmake -S "$src" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF \
    -DGGML_NATIVE=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    >"$build.cmake.log" 2>&1 || { cat "$build.cmake.log" >&2; exit 1; }
cmake --build "$build" --target llama llama-server -j "$jobs"
test -f "$lib" || lib_found=$(find "$build" -name 'libllama.so' | head -1)
if [ ! -f "$lib" ]; then
    echo "libllama.so not at $lib (found: ${lib_found:-none})" >&2
    exit 1
fi
echo "llama.cpp $version built in $(( $(date +%s) - start )) s: $build"
