"""The committed bundles' pinned manifest digests: a table with no imports, so that whatever
only needs to know "is this digest the pinned one" (a certificate, `verify-certificate`) does
not load torch. harness.golden.integrity re-exports it and checks bundles against it."""

from __future__ import annotations

# sha256 of golden/<name>/manifest.json as committed (the manifest pins every file's sha256,
# so this one digest pins the whole bundle). Rebuilding the bundle means updating it here;
# tests/test_bad_input_bundle.py checks the committed bundle against it.
PINNED_MANIFESTS: dict[str, str] = {
    "tiny-dsv3": "1e8fa4454a3769e4187621397f5c32616bd21ddb54a83acb46b3e35bebeceb39",
    # the Qwen3-MoE bundle beside it (issue #37): the target llama.cpp can capture from
    "tiny-qwen3moe": "a8bdc0cf02cd6e9ceff8de2d705d3bc07866d19eca16127205460aaa223142ec",
}
