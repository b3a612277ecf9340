"""The llamacpp adapter (harness/engines/llamacpp.py): what it says where llama.cpp is not
built, the switches it applies, and, against the real build, that it reports what llama.cpp
does on a scratch Qwen3-MoE (tests/llamacpp_scratch.py), whose graph llama.cpp captures.

The draft is a "constant drafter" (tests/llamacpp_scratch.py `constant_drafter`): it proposes
one token X that the target's greedy output repeats, so llama.cpp's own counters carry
accepted tokens (a random draft accepts none, and broken counters would read the same); its ids (0, 2, 3) are not llama.cpp's default (2, 2, 1 for N = 4), so a capture
that fell back to the default would show.

The real-engine tests skip, with the reason printed, where llama.cpp is not built
(scripts/build_llamacpp.sh).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from harness.engines import llamacpp
from harness.engines.base import EngineCrash, EngineOptions, EngineUnavailable
from harness.engines.llamacpp import LlamacppEngine, kv_overrides, missing_build, source_dir
from harness.run.registry import resolve_engine

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_scratch import (  # noqa: E402
    HIDDEN,
    boundaries,
    build_draft,
    build_qwen3moe,
    constant_drafter,
    mark_embeddings,
)

IDS = [0, 2, 3]
PROMPTS = [[9, 10, 11], [5, 6, 7, 8, 21, 40]]
NEW_TOKENS = 12


def test_registered_as_llamacpp() -> None:
    assert resolve_engine("llamacpp") is LlamacppEngine
    assert LlamacppEngine.convention == "llamacpp"


def test_unavailable_without_a_build_says_how_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No build: EngineUnavailable (every check skips with it), naming the script."""
    monkeypatch.setenv("EAGLE3_LLAMACPP_BUILD", str(tmp_path / "nothing"))
    with pytest.raises(EngineUnavailable) as err:
        LlamacppEngine(tmp_path, tmp_path, EngineOptions())
    assert "scripts/build_llamacpp.sh" in str(err.value) and "libllama.so" in str(err.value)


def test_only_a_query_lora_less_deepseek_gets_the_override() -> None:
    """llama.cpp tells a DeepSeek without q_lora_rank by its layer count (26/27/48): any other
    such target needs the rank said, 0; a target that has one, or another family, gets none."""
    assert kv_overrides({"model_type": "deepseek_v3", "q_lora_rank": None}) == {
        "deepseek2.attention.q_lora_rank": 0}
    assert kv_overrides({"model_type": "deepseek_v3", "q_lora_rank": 1536}) == {}
    assert kv_overrides({"model_type": "qwen3_moe"}) == {}


@pytest.mark.slow(reason="runs llama.cpp's converter once (~15 s)")
def test_conversion_is_cached_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same bytes are converted once: a second call must not run the converter (a
    Hypothesis draft in a fresh folder with the same bytes reuses it too)."""
    if not (source_dir() / "convert_hf_to_gguf.py").is_file():
        print(f"llama.cpp sources missing at {source_dir()}: run scripts/fetch_llamacpp.sh")
        pytest.skip(f"llama.cpp sources missing at {source_dir()}: run scripts/fetch_llamacpp.sh")
    from harness.engines import _llamacpp_convert

    target = build_qwen3moe(tmp_path / "target")
    first = _llamacpp_convert.convert(source_dir(), target, tmp_path / "gguf", "f32", vocab_size=256)
    copy = tmp_path / "copy" / "target"
    copy.mkdir(parents=True)
    for f in target.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())

    def no_converter(*_a: object, **_k: object) -> None:
        raise AssertionError("the converter ran again for the same bytes")

    monkeypatch.setattr(_llamacpp_convert.subprocess, "run", no_converter)
    assert _llamacpp_convert.convert(source_dir(), copy, tmp_path / "gguf", "f32", vocab_size=256) == first


# -- against the real build -------------------------------------------------------------------

@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    why = missing_build()
    if why is not None:
        print(f"llama.cpp unavailable: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("llamacpp_adapter")
    target = build_qwen3moe(root / "target")
    mark_embeddings(target)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    plain = []
    with torch.no_grad():
        for p in PROMPTS:
            out = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS, pad_token_id=0)
            plain.append(out[0, len(p):].tolist())
    x = max(set(plain[0]), key=plain[0].count)  # the token the greedy output repeats most
    draft = build_draft(root / "draft", IDS)
    constant_drafter(draft, x)
    two = build_draft(root / "two-ids", [0, 2])
    return {"target": target, "draft": draft, "two": two, "plain": plain, "x": x}


@pytest.fixture(scope="module")
def engine(built: dict):  # noqa: ANN201 - a generator fixture
    e = LlamacppEngine(built["target"], built["draft"], EngineOptions(dtype="float32", num_draft_tokens=4))
    yield e
    e.close()
    llamacpp.shutdown()




@pytest.mark.engine
@pytest.mark.slow(reason="converts and starts llama.cpp (~30 s)")
def test_capture_is_the_boundaries_llamacpp_reads_from_the_draft(built: dict, engine: LlamacppEngine) -> None:
    """llama.cpp's rule, b = id, on the ids its converter wrote from the top-level key; fp32
    (flash attention off) to summation order against transformers."""
    capture = engine.capture(PROMPTS)
    assert capture.fc_out is None
    for prompt, feats in zip(PROMPTS, capture.features, strict=True):
        golden = boundaries(built["target"], prompt)
        assert feats.shape == (len(prompt), len(IDS) * HIDDEN)
        for slot, b in enumerate(IDS):
            x = feats[:, slot * HIDDEN:(slot + 1) * HIDDEN]
            err = float(((x - golden[b]).norm(dim=-1) / golden[b].norm(dim=-1)).max())
            assert err < 1e-5, (slot, b, err)
    info = engine.info()
    assert info["draft_target_layers"] == IDS and info["flash_attn"] == "off"
    assert info["kv_cache_type"] == "f32" and info["kv_overrides"] == {}


@pytest.mark.engine
@pytest.mark.slow(reason="converts and starts llama.cpp (~30 s)")
def test_greedy_generation_is_transformers_and_speculation_lossless(built: dict, engine: LlamacppEngine) -> None:
    plain = engine.generate(PROMPTS, NEW_TOKENS, speculative=False)
    assert plain.tokens == built["plain"] and plain.acceptance is None
    spec = engine.generate(PROMPTS, NEW_TOKENS, speculative=True)
    assert spec.tokens == built["plain"]
    acc, per = spec.acceptance, spec.per_prompt_acceptance
    assert acc is not None and per is not None and len(per) == len(PROMPTS)
    print(f"llama.cpp counters with the constant drafter (x={built['x']}): {acc}, per prompt {per}")
    assert acc.num_drafts > 0 and 0 < acc.num_accepted_tokens <= acc.num_draft_tokens
    # exactly the accepted tokens are X: a chain accepts a prefix of its k copies of X, so
    # the accepted count is at most the X's in the output (the first token is the prefill's)
    assert acc.num_accepted_tokens <= sum(toks[1:].count(built["x"]) for toks in spec.tokens)
    assert acc.num_draft_tokens <= 4 * acc.num_drafts
    # every round's tokens are its accepted drafts plus one: no more than generated
    for a in per:
        assert a.num_accepted_tokens + a.num_drafts <= NEW_TOKENS


@pytest.mark.engine
@pytest.mark.slow(reason="converts and starts llama.cpp (~30 s)")
def test_a_draft_without_three_ids_is_refused_as_llamacpp_refuses_it(built: dict) -> None:
    """llama.cpp's EAGLE-3 path takes exactly 3 aux layers, and refuses the draft's GGUF at
    load already (src/models/eagle3.cpp): both ops fail with its words (read from its log),
    and the crash diagnosis names engine_cannot_express with the draft's count."""
    from harness.diagnosis.crash import crash_diagnosis

    e = LlamacppEngine(built["target"], built["two"], EngineOptions(dtype="float32"))
    try:
        with pytest.raises(EngineCrash) as err:
            e.capture(PROMPTS[:1])
        assert "EAGLE3 requires exactly 3 entries in 'extract_layers'" in str(err.value)
        with pytest.raises(EngineCrash) as err:
            e.generate(PROMPTS[:1], 4, speculative=True)
        assert "EAGLE3 requires exactly 3 entries in 'extract_layers'" in str(err.value)
    finally:
        e.close()
    d = crash_diagnosis(str(err.value), [0, 2], HIDDEN)
    assert d.kind == "engine_cannot_express" and d.suggested_layer_ids is None
    assert "takes exactly 3 aux layers and this draft has 2" in d.message


@pytest.mark.parametrize("omp, threads", [(None, 1), ("3", 3), (" 2 ", 2), ("0", 1), ("all", 1)])
def test_llamacpp_computes_on_one_thread_unless_told(monkeypatch, omp: str | None, threads: int) -> None:
    """libllama's contexts and llama-server take `cpu_threads()`: one thread on the suite's tiny
    bundles (faster than two there, and llama.cpp's threads spin while they wait, which costs
    the other work on a shared machine), OMP_NUM_THREADS where the user sets it to a count."""
    from harness.engines._llamacpp_lib import cpu_threads

    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert cpu_threads() == threads
