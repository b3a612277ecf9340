"""The verdict on llama.cpp for the committed bundle (golden/tiny-dsv3, a DeepSeek-V3 target,
llama.cpp architecture deepseek2): llama.cpp cannot express any of its drafts' wirings, and
the suite says so as findings (`engine_cannot_express`, suites/xfails/llamacpp.txt), not as a
crash of the pytest session.

Why, from llama.cpp 11434.0.0's sources and shown here on its build: its EAGLE-3 path reads
the target's states through `llama_set_embeddings_layer_inp`, and only graphs that record
`t_layer_inp` provide them; deepseek2's does not, so the first decode with extraction on fails
`GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")` and aborts the
process (the adapter's worker, or llama-server). The target itself is served right: plain
greedy decoding equals the bundle's golden continuations, and the one state llama.cpp can
extract there, id n_layer, is the final state after the norm (`final_boundary_normed` for a
final-aux draft, were the rest capturable).

The message tests run anywhere; the engine tests skip, with the reason printed, where llama.cpp
is not built (scripts/build_llamacpp.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.diagnosis.crash import crash_diagnosis
from harness.engines.base import EngineCrash, EngineOptions
from harness.engines.llamacpp import LlamacppEngine, build_dir, missing_build
from harness.golden.bundle import load_bundle
from harness.run.xfails import read_xfails

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "golden" / "tiny-dsv3"
# llama.cpp's own words, as its worker reports them (the file and line are the build's)
ASSERT = ('llama.cpp failed during capture: llama.cpp worker died (killed by signal 6); its log '
          'ends: /x/src/llama-graph.cpp:1413: GGML_ASSERT(t_layer_inp[il] != nullptr && '
          '"layer input tensor is null") failed')
NOT_THREE = ("llama.cpp could not start with this EAGLE-3 draft: LlamaError: llama.cpp could not "
             "load d.gguf: error loading model hyperparameters: EAGLE3 requires exactly 3 entries "
             "in 'extract_layers'")
FC_WIDTH = ("llama.cpp could not load d.gguf: llama_model_load: error loading model: "
            "check_tensor_dims: tensor 'fc.weight' has wrong shape; expected    384,    128, "
            "got    128,    128,      1,      1")


@pytest.mark.parametrize("message, ids, needle", [
    (ASSERT, [1, 3, 4], "graph records no layer input"),
    (NOT_THREE, [0], "takes exactly 3 aux layers and this draft has 1"),
    (FC_WIDTH, [3], "takes exactly 3 aux layers and this draft has 1"),
])
def test_llamacpp_refusals_are_engine_cannot_express(message: str, ids: list[int], needle: str) -> None:
    d = crash_diagnosis(message, ids, target_hidden=128, engine_convention="llamacpp",
                        training_boundaries=[2, 4, 5], num_layers=8)
    assert d.kind == "engine_cannot_express" and needle in d.message, d.message
    assert d.suggested_layer_ids is None and "no layer ids fix it" in d.message


@pytest.mark.parametrize("message", [
    "EAGLE3: target layer id 9 exceeds target n_layer 8",  # an id past the last layer: the ids' fault
    FC_WIDTH.replace("got    128", "got    384"),  # a width that is 3 slots is not this refusal
    "CUDA out of memory",
])
def test_other_llamacpp_errors_stay_engine_crash(message: str) -> None:
    assert crash_diagnosis(message, [1, 3, 9], target_hidden=128).kind == "engine_crash"


def test_the_xfails_list_is_the_verdict_every_line_engine_cannot_express() -> None:
    """suites/xfails/llamacpp.txt, generated from the suite's report on the committed bundle
    (scripts/xfails_from_report.py): every known nonconformance is this one finding, and every
    draft of the bundle has it."""
    rules = read_xfails(REPO / "suites" / "xfails" / "llamacpp.txt")
    assert len(rules) >= 40
    assert all(r.reason.startswith("[engine_cannot_express]") for r in rules), \
        [r.pattern for r in rules if not r.reason.startswith("[engine_cannot_express]")]
    for draft in load_bundle(BUNDLE, verify_hashes=False).draft_names:
        assert any(f"[{draft}]" in r.pattern for r in rules), draft


# -- against the real build -------------------------------------------------------------------

@pytest.fixture(scope="module")
def bundle():  # noqa: ANN201
    why = missing_build()
    if why is not None:
        print(f"llama.cpp unavailable: {why}")
        pytest.skip(why)
    return load_bundle(BUNDLE)


@pytest.mark.engine
@pytest.mark.slow(reason="converts the bundle and starts llama.cpp (~40 s cold, ~10 s cached)")
def test_capture_on_deepseek2_aborts_in_the_worker_not_in_pytest(bundle) -> None:  # noqa: ANN001
    """Capture and speculative generation both die of llama.cpp's assertion; this process
    lives on, plain generation still works, and it is the golden greedy output."""
    e = LlamacppEngine(bundle.target_dir, bundle.draft_dir("specforge-default"), EngineOptions(dtype="float32"))
    try:
        with pytest.raises(EngineCrash) as err:
            e.capture(bundle.prompts()[:2])
        assert "layer input tensor is null" in str(err.value) and "signal 6" in str(err.value)
        # quoted relative to llama.cpp's sources: the same finding reads the same on any machine
        assert "src/llama-graph.cpp:" in str(err.value) and str(REPO) not in str(err.value)
        assert ".llamacpp/" not in str(err.value)
        d = crash_diagnosis(str(err.value), [1, 3, 4], bundle.hidden_size)
        assert d.kind == "engine_cannot_express"
        with pytest.raises(EngineCrash) as err:
            e.generate(bundle.prompts()[:1], 4, speculative=True)
        assert "layer input tensor is null" in str(err.value)
        gen = int(bundle.manifest["prompts"]["continuation_len"])
        prompts = bundle.prompts()[:4]
        plain = e.generate(prompts, gen, speculative=False)
        golden = bundle.tensors["continuations"][:4].tolist()
        assert plain.tokens == golden
        assert e.info()["kv_overrides"] == {"deepseek2.attention.q_lora_rank": 0}
    finally:
        e.close()


_FINAL = """
import json, sys
import numpy as np
from harness.engines._llamacpp_convert import convert
from harness.engines._llamacpp_lib import LlamaLib
from pathlib import Path
lib_path, src, target, cache, prompt, n = json.loads(sys.argv[1])
gguf = convert(Path(src), Path(target), Path(cache), "f32", vocab_size=512)
lib = LlamaLib(lib_path)
model = lib.load_model(gguf, {"deepseek2.attention.q_lora_rank": 0})
np.save(sys.argv[2], lib.capture(model, [n], [prompt], 256, "f32", False)[0])
"""


@pytest.mark.engine
@pytest.mark.slow(reason="converts the bundle's target (~20 s cold)")
def test_final_id_on_deepseek2_is_the_state_after_the_norm(bundle, tmp_path: Path) -> None:  # noqa: ANN001
    """The one state llama.cpp extracts from deepseek2: id n_layer, after the final norm (the
    golden `final_normed`), not boundary N; the DESIGN.md fact, measured."""
    from harness.engines.llamacpp import source_dir

    prompt = bundle.prompts()[0]
    n = bundle.num_layers
    out = tmp_path / "final.npy"
    args = [str(build_dir() / "bin" / "libllama.so"), str(source_dir()), str(bundle.target_dir),
            str(build_dir().parent / "gguf"), prompt, n]
    done = subprocess.run([sys.executable, "-c", _FINAL, json.dumps(args), str(out)], capture_output=True,
                          text=True, timeout=600, cwd=REPO,
                          env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = torch.from_numpy(__import__("numpy").load(out))
    t = len(prompt)
    normed = bundle.tensors["final_normed"][0, :t]
    boundary = bundle.tensors["boundaries"][0, n, :t]
    rel = lambda a, b: float(((a - b).norm(dim=-1) / b.norm(dim=-1)).max())  # noqa: E731
    print(f"deepseek2 id {n}: worst error to final_normed {rel(rows, normed):.2e}, "
          f"to boundary {n} {rel(rows, boundary):.2e}")
    assert rel(rows, normed) < 1e-4 and rel(rows, boundary) > 0.1


@pytest.mark.engine
@pytest.mark.slow(reason="runs one suite check against llama.cpp (~15 s cached)")
def test_the_suite_reports_the_abort_as_a_finding(bundle, tmp_path: Path) -> None:  # noqa: ANN001
    """The suite's own capture check against llama.cpp on the committed bundle: the session
    ends normally, the check is the strict xfail of suites/xfails/llamacpp.txt, and report.json
    carries the diagnosis."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "suites/test_aux_capture.py",
         "--engine", "llamacpp", "--draft", "specforge-default", "-k", "pinned",
         "--report-dir", str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    [check] = [c for c in report["checks"] if "test_capture_pinned_prompts" in c["id"]]
    assert check["status"] == "xfail", check
    assert [d["kind"] for d in check["diagnoses"]] == ["engine_cannot_express"]


def test_a_build_elsewhere_is_quoted_relative_to_its_sources_too() -> None:
    """A crash of a build outside this checkout (EAGLE3_LLAMACPP_BUILD, as when a report is
    made from another clone's build) names that clone's source tree: report.json and
    docs/CONFORMANCE.md quoted /tmp/ci_clone/.llamacpp/11434.0.0/src/src/llama-graph.cpp."""
    from harness.engines.llamacpp import _FOREIGN_SOURCES

    said = ("llama.cpp failed during capture: llama.cpp worker died (killed by signal 6); its log "
            "ends: /tmp/ci_clone/.llamacpp/11434.0.0/src/src/llama-graph.cpp:1702: GGML_ASSERT(t) failed")
    assert _FOREIGN_SOURCES.sub("", said).endswith("its log ends: src/llama-graph.cpp:1702: GGML_ASSERT(t) failed")
