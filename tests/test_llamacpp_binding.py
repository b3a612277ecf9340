"""The ctypes binding of libllama (harness/engines/_llamacpp_lib.py) against the real build, on
a scratch Qwen3-MoE (tests/llamacpp_scratch.py): an architecture whose llama.cpp graph records
every layer's input, which the committed bundle's deepseek2 does not.

What it proves: the states libllama's own extraction calls return for id k are transformers'
boundary k (the input of layer k) on the same weights, in fp32 up to summation order once
flash attention is off (llama.cpp's CPU flash attention computes in f16: that is why the
adapter serves fp32 with `-fa off`), and in bf16 within bf16 rounding of the weights; and what
llama.cpp does at the edges of its rule (id n_layer on qwen3moe: a buffer never written, zeros;
a negative id: its own assertion). Each capture runs in a subprocess: llama.cpp aborts the
process on a broken precondition, and one such case is tested here on purpose.

Skips, with the reason printed, where llama.cpp is not built (scripts/build_llamacpp.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.engines.llamacpp import build_dir, missing_build, source_dir

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_scratch import HIDDEN, LAYERS, VOCAB, boundaries, build_qwen3moe  # noqa: E402

pytestmark = [pytest.mark.engine,
              pytest.mark.slow(reason="converts with llama.cpp's converter and runs libllama (~40 s)")]

PROMPT = [5, 6, 7, 8, 9, 10, 11, 3, 200, 17, 42, 99]
_RUN = """
import json, sys
import numpy as np
from harness.engines._llamacpp_lib import LlamaLib
lib_path, gguf, ids, prompt, cache, fa = json.loads(sys.argv[1])
lib = LlamaLib(lib_path)
rows = lib.capture(lib.load_model(gguf), ids, [prompt], 256, cache, fa)[0]
np.save(sys.argv[2], rows)
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> dict:
    why = missing_build()
    if why is not None:
        print(f"llama.cpp unavailable: {why}")
        pytest.skip(why)
    from harness.engines._llamacpp_convert import convert

    root = tmp_path_factory.mktemp("llamacpp_binding")
    target = build_qwen3moe(root / "target")
    ggufs = {t: convert(source_dir(), target, root / "gguf", t, vocab_size=VOCAB) for t in ("f32", "bf16")}
    return {"root": root, "target": target, "gguf": ggufs,
            "golden": boundaries(target, PROMPT)}


def _capture(scratch: dict, outtype: str, ids: list[int], flash_attn: bool | None = False
             ) -> tuple[subprocess.CompletedProcess[str], torch.Tensor | None]:
    """The binding's capture of PROMPT in a fresh process: its exit and the rows it saved."""
    out = scratch["root"] / f"rows-{outtype}-{'_'.join(map(str, ids))}-{flash_attn}.npy"
    args = [str(build_dir() / "bin" / "libllama.so"), str(scratch["gguf"][outtype]), ids, PROMPT,
            outtype, flash_attn]
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(args), str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin",
                               "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return done, torch.from_numpy(np.load(out)) if out.is_file() else None


def _worst(rows: torch.Tensor, golden: torch.Tensor, ids: list[int]) -> list[float]:
    """Per slot, the worst per-token relative L2 error against transformers' boundary id."""
    out = []
    for s, b in enumerate(ids):
        x = rows[:, s * HIDDEN:(s + 1) * HIDDEN]
        out.append(float(((x - golden[b]).norm(dim=-1) / golden[b].norm(dim=-1)).max()))
    return out


def test_fp32_capture_is_the_boundaries_up_to_summation_order(scratch: dict) -> None:
    """Measured 2.7e-7 / 4.7e-7 one and three layers deep (the embedding exactly)."""
    ids = [0, 1, 3]
    done, rows = _capture(scratch, "f32", ids)
    assert done.returncode == 0 and rows is not None, done.stderr[-2000:]
    worst = _worst(rows, scratch["golden"], ids)
    print(f"llama.cpp fp32 capture, worst relative error per slot {ids}: {worst}")
    assert worst[0] == 0.0 and max(worst) < 1e-5, worst
    # the test can fail: the same rows are far from the neighbouring boundaries
    assert min(_worst(rows, scratch["golden"], [1, 2, 4])) > 0.1


def test_fp32_with_flash_attention_is_rounded_to_f16(scratch: dict) -> None:
    """llama.cpp's default flash attention ("auto", on for the CPU) rounds to f16: measured
    3.7e-4 one layer deep, three orders above the fp32 figure; why the adapter turns it off."""
    done, rows = _capture(scratch, "f32", [0, 1, 3], flash_attn=None)
    assert done.returncode == 0 and rows is not None, done.stderr[-2000:]
    worst = _worst(rows, scratch["golden"], [0, 1, 3])
    print(f"llama.cpp fp32 capture with flash attention auto: {worst}")
    assert 1e-5 < max(worst) < 1e-2, worst


def test_bf16_capture_within_bf16_rounding(scratch: dict) -> None:
    """bf16 weights (llama.cpp's converter, --outtype bf16) against fp32 transformers: measured
    1.9e-3 (embedding) to 7e-3 three layers deep; bf16's unit roundoff is 3.9e-3."""
    ids = [0, 1, 3]
    done, rows = _capture(scratch, "bf16", ids, flash_attn=None)
    assert done.returncode == 0 and rows is not None, done.stderr[-2000:]
    worst = _worst(rows, scratch["golden"], ids)
    print(f"llama.cpp bf16 capture, worst relative error per slot {ids}: {worst}")
    assert 1e-4 < max(worst) < 5e-2, worst
    assert min(_worst(rows, scratch["golden"], [1, 2, 4])) > 0.1


def test_final_id_on_qwen3moe_feeds_zeros(scratch: dict) -> None:
    """id == n_layer reads llama_get_embeddings_nextn, which qwen3moe's graph never sets
    (no t_h_nextn): llama.cpp hands the draft an unwritten buffer, zeros here, not boundary N.
    If llama.cpp starts filling it, this test says so."""
    done, rows = _capture(scratch, "f32", [0, 2, LAYERS])
    assert done.returncode == 0 and rows is not None, done.stderr[-2000:]
    final = rows[:, 2 * HIDDEN:]
    print(f"id {LAYERS} (n_layer) on qwen3moe: max |value| {float(final.abs().max())}")
    assert float(final.abs().max()) == 0.0
    assert scratch["golden"][LAYERS].norm() > 0


def test_negative_id_aborts_in_llamacpp_own_assertion(scratch: dict) -> None:
    """A negative id is cast to uint32 as in common/speculative.cpp, and llama.cpp aborts the
    process (GGML_ASSERT lid <= n_layer): the reason every llama.cpp call runs in a worker."""
    done, rows = _capture(scratch, "f32", [-1, 2, 3])
    assert done.returncode < 0 and rows is None, (done.returncode, done.stderr[-500:])
    assert "GGML_ASSERT(lid <= model.hparams.n_layer())" in done.stderr, done.stderr[-500:]
