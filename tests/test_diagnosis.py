"""Diagnosis against real target features: each bug class is synthesized the way an engine
would commit it (wrong boundary, wrong order, normed or residual-less state, skipped capture)
and must come back with its name and the right fix."""

from __future__ import annotations

import json

import pytest
import torch

from harness.core.tolerances import rtol_for
from harness.diagnosis.capture import diagnose_capture
from harness.diagnosis.crash import crash_diagnosis
from harness.diagnosis.draft_side import fc_diagnosis, fc_output_is_raw_input
from harness.diagnosis.record import Diagnosis
from harness.golden.features import TargetFeatures, aux_features, target_features
from harness.judgement.assertions import judge_fc
from harness.models.target import build_target, target_config_dict

N = 8
SPECFORGE = [2, 4, 5]  # SpecForge default ids [1, 3, 4]
EMBED_FIRST = [0, 4, 6]  # "-1 = embedding" ids [-1, 3, 5]
WITH_FINAL = [0, 4, N]


@pytest.fixture(scope="module")
def golden() -> list[TargetFeatures]:
    model = build_target(target_config_dict(num_layers=N), seed=0)
    return [target_features(model, p) for p in ([5, 9, 17, 33, 2, 71, 8, 8, 40, 11], [3, 100, 7, 6])]


def _engine(golden, slots) -> list[torch.Tensor]:
    """Engine features whose slot s holds `slots[s]`: a boundary int, or a callable of the
    golden features of the prompt."""
    out = []
    for g in golden:
        chunks = [g.boundaries[s] if isinstance(s, int) else s(g) for s in slots]
        out.append(torch.cat(chunks, dim=-1))
    return out


def test_correct_capture_is_ok(golden):
    features = [aux_features(g, SPECFORGE) for g in golden]
    d = diagnose_capture(features, golden, SPECFORGE, engine_convention="vllm", config_ids=[1, 3, 4])
    assert d.kind == "ok" and d.suggested_layer_ids is None
    assert d.engine_boundaries == SPECFORGE
    assert "sglang" in d.consistent_conventions and "specforge" in d.consistent_conventions


def test_bf16_rounding_of_a_correct_capture_is_ok(golden):
    features = [aux_features(g, EMBED_FIRST).bfloat16().float() for g in golden]
    d = diagnose_capture(features, golden, EMBED_FIRST, rtol=rtol_for(torch.bfloat16))
    assert d.kind == "ok"
    assert all(s.cosine > 0.999 for s in d.slots)


@pytest.mark.parametrize("shift,convention,ids", [(+1, "vllm", [2, 4, 5]), (-1, "sglang", [1, 3, 4])])
def test_offset(golden, shift, convention, ids):
    features = _engine(golden, [b + shift for b in SPECFORGE])
    d = diagnose_capture(features, golden, SPECFORGE, engine_convention=convention)
    assert d.kind == "offset" and d.offset == shift
    assert d.suggested_layer_ids == ids
    assert f"offset {shift:+d}" in d.message and f"Set eagle_aux_hidden_state_layer_ids to {ids}" in d.message


def test_offset_names_the_convention_the_engine_behaved_like(golden):
    # a SpecForge draft (ids [1, 3, 4]) served by an engine that reads ids as b = id
    features = _engine(golden, [1, 3, 4])
    d = diagnose_capture(features, golden, SPECFORGE, engine_convention="vllm", config_ids=[1, 3, 4])
    assert d.kind == "offset" and d.offset == -1
    assert "vllm" in d.consistent_conventions and "llamacpp" in d.consistent_conventions


def test_embedding_missing_vllm_cannot_fix(golden):
    # the motivating case in miniature: training cat(embedding, 3, 5), engine cat(3, 5, 7)
    train = [0, 3, 5]
    d = diagnose_capture(_engine(golden, [3, 5, 7]), golden, train, engine_convention="vllm")
    assert d.kind == "embedding_missing"
    assert d.engine_boundaries == [3, 5, 7]
    assert d.suggested_layer_ids is None
    assert d.message.startswith("slot 0 is boundary 3 (input of layer 3), training used boundary 0 "
                                "(the embedding); root cause: embedding missing")
    assert "vllm cannot capture boundary 0" in d.message and "no id list fixes this" in d.message


def test_embedding_missing_fixable_where_the_engine_captures_it(golden):
    d = diagnose_capture(_engine(golden, [4, 6, 7]), golden, EMBED_FIRST, engine_convention="vllm-llama")
    assert d.kind == "embedding_missing"
    assert d.suggested_layer_ids == [0, 4, 6]


def test_embedding_missing_as_zero_slot(golden):
    features = _engine(golden, [lambda g: torch.zeros_like(g.boundaries[0]), 4, 6])
    d = diagnose_capture(features, golden, EMBED_FIRST)
    assert d.kind == "embedding_missing" and d.engine_boundaries[0] == "zero"
    assert d.suggested_layer_ids is None and "Name the engine's convention" in d.message


def test_order_permuted(golden):
    features = _engine(golden, [4, 2, 5])
    d = diagnose_capture(features, golden, SPECFORGE, engine_convention="specforge")
    assert d.kind == "order_permuted" and d.suggested_layer_ids == [1, 3, 4]


def test_order_permuted_by_a_sorting_engine_has_no_id_fix(golden):
    train = [5, 2, 4]  # SpecForge ids [4, 1, 3], list order kept in training
    d = diagnose_capture(_engine(golden, [2, 4, 5]), golden, train, engine_convention="sglang")
    assert d.kind == "order_permuted" and d.suggested_layer_ids is None
    assert "ascending" in d.message and "permute the draft's fc input columns" in d.message


def test_final_boundary_normed(golden):
    features = _engine(golden, [0, 4, lambda g: g.final_normed])
    d = diagnose_capture(features, golden, WITH_FINAL, engine_convention="vllm-llama")
    assert d.kind == "final_boundary_normed"
    assert d.engine_boundaries == [0, 4, "final_normed"]
    assert d.suggested_layer_ids is None and "engine bug" in d.message


def test_final_boundary_missing_fewer_slots(golden):
    # SGLang: boundary N is never captured, so only two slots arrive
    d = diagnose_capture(_engine(golden, [2, 4]), golden, [2, 4, N], engine_convention="sglang")
    assert d.kind == "final_boundary_missing"
    assert d.suggested_layer_ids is None and "sglang cannot capture boundary 8" in d.message
    assert "handed 2 slots, training used 3 (boundaries [8] never arrived)" in d.message


def test_final_boundary_missing_zero_slot(golden):
    features = _engine(golden, [0, 4, lambda g: torch.zeros_like(g.boundaries[0])])
    d = diagnose_capture(features, golden, WITH_FINAL, engine_convention="vllm-llama")
    assert d.kind == "final_boundary_missing" and d.suggested_layer_ids == [0, 4, N]


def test_residual_missing(golden):
    features = _engine(golden, [2, lambda g: g.mlp_out[4], 5])
    d = diagnose_capture(features, golden, SPECFORGE)
    assert d.kind == "residual_missing" and d.engine_boundaries[1] == "mlp_out[4]"
    assert "without adding the residual" in d.message


def test_stale_or_skipped_some_positions(golden):
    def half_zero(g: TargetFeatures) -> torch.Tensor:
        x = g.boundaries[5].clone()
        x[x.shape[0] // 2:] = 0
        return x

    d = diagnose_capture(_engine(golden, [2, 4, half_zero]), golden, SPECFORGE)
    assert d.kind == "stale_or_skipped"
    assert 0 < d.slots[2].expected_fraction < 1 and d.slots[2].zero_fraction > 0


def test_stale_values_from_another_prompt(golden):
    # a static buffer not rewritten for the second prompt keeps the first prompt's values
    stale = golden[0].boundaries[4]
    features = [aux_features(golden[0], SPECFORGE),
                torch.cat([golden[1].boundaries[2], stale[:golden[1].boundaries.shape[1]],
                           golden[1].boundaries[5]], dim=-1)]
    d = diagnose_capture(features, golden, SPECFORGE)
    assert d.kind == "stale_or_skipped" and d.slots[1].expected_fraction < 1


def test_skipped_layer_leaves_a_zero_slot(golden):
    features = _engine(golden, [2, lambda g: torch.zeros_like(g.boundaries[0]), 5])
    d = diagnose_capture(features, golden, SPECFORGE, engine_convention="sglang")
    assert d.kind == "stale_or_skipped" and d.suggested_layer_ids is None


def test_skipped_layers_arrive_as_fewer_slots(golden):
    d = diagnose_capture(_engine(golden, [2, 5]), golden, SPECFORGE, engine_convention="sglang")
    assert d.kind == "stale_or_skipped" and "boundaries [4] never arrived" in d.message


def test_unrecognised_and_json(golden):
    noise = torch.Generator().manual_seed(0)
    features = _engine(golden, [2, lambda g: torch.randn(g.boundaries[0].shape, generator=noise), 5])
    d = diagnose_capture(features, golden, SPECFORGE)
    assert d.kind == "unrecognised" and d.engine_boundaries[1] is None
    seen = d.details["seen"][1]
    assert seen["expected"] == 4 and len(seen["nearest"]) == 2 and seen["first_off_tokens"]
    assert "Seen per slot" in d.message and "Confidence margin: none" in d.message
    blob = json.loads(json.dumps(d.to_json()))
    assert {"kind", "message", "engine_boundaries", "training_boundaries",
            "suggested_layer_ids"} <= set(blob)


def test_bad_inputs(golden):
    with pytest.raises(ValueError, match="multiple of the target hidden size"):
        diagnose_capture([torch.zeros(10, 100), torch.zeros(4, 100)], golden, SPECFORGE)
    with pytest.raises(ValueError, match="one of each per prompt"):
        diagnose_capture([aux_features(golden[0], SPECFORGE)], golden, SPECFORGE)
    with pytest.raises(ValueError, match="golden tokens"):
        diagnose_capture([aux_features(g, SPECFORGE)[:3] for g in golden], golden, SPECFORGE)
    with pytest.raises(ValueError, match="no tolerance"):
        rtol_for("int8")
    with pytest.raises(ValueError, match="unknown diagnosis kind"):
        Diagnosis(kind="weird", message="", engine_boundaries=[], training_boundaries=[],
                  suggested_layer_ids=None)


def test_fc_level_constructors(golden):
    aux = aux_features(golden[0], [4])
    assert fc_output_is_raw_input(aux.clone(), aux, 1e-3) == 0
    assert fc_output_is_raw_input(torch.randn_like(aux), aux, 1e-3) is None
    for kind in ("fc_skipped", "fc_on_recurrent_state", "d2t_absolute", "draft_kv_not_rolled_back"):
        d = fc_diagnosis(kind, "fc output equals slot 0", slot=0)
        assert d.kind == kind and d.message.startswith("fc output equals slot 0; root cause:")
        assert d.details == {"slot": 0} and json.dumps(d.to_json())
    with pytest.raises(ValueError, match="unknown fc-level kind"):
        fc_diagnosis("offset")


def test_judge_fc_names_skip_and_wrong_projection(golden):
    """One judge for the fc suite and the acceptance explainer: per token, a raw aux slot
    passed on is `fc_skipped`, any other wrong projection `fc_wrong`, a match has no
    diagnosis."""
    torch.manual_seed(0)
    feats = [aux_features(g, SPECFORGE) for g in golden]
    fc = torch.nn.Linear(feats[0].shape[-1], feats[0].shape[-1] // 3, bias=False)
    with torch.no_grad():
        expected = [fc(f) for f in feats]
    flags = {"draft_hidden": fc.out_features, "norm_before_fc": False, "fc_norm": False}
    ok = judge_fc(expected, feats, expected, 1e-3, **flags)
    assert ok.passed and ok.diagnosis is None and ok.measured["tokens"] == sum(f.shape[0] for f in feats)
    raw = [f[:, fc.out_features:2 * fc.out_features] for f in feats]
    skipped = judge_fc(raw, feats, expected, 1e-3, **flags)
    assert skipped.diagnosis is not None and skipped.diagnosis.kind == "fc_skipped"
    assert "aux slot 1 unprojected" in skipped.why
    assert skipped.measured["tokens_off"] == skipped.measured["tokens"]
    one_token = [e.clone() for e in expected]
    one_token[0][-1] *= 1.5
    wrong = judge_fc(one_token, feats, expected, 1e-3, **flags)
    assert wrong.diagnosis is not None and wrong.diagnosis.kind == "fc_wrong"
    assert wrong.measured["tokens_off"] == 1 and "on 1/" in wrong.why
    assert wrong.failure is not None and wrong.failure.diagnoses == [wrong.diagnosis]


def test_ids_ignored_engine_fell_back_to_its_defaults(golden):
    """vLLM's V2 runner on a SpecForge draft trained with ids [1, 3, 7]: it never reads the
    nested ids and captures (2, N//2, N-3). Blaming slot 2's "missing final boundary" would
    send the user after the wrong fix."""
    d = diagnose_capture(_engine(golden, [2, 4, 5]), golden, [2, 4, N], engine_convention="vllm",
                         config_ids=[1, 3, 7])
    assert d.kind == "ids_ignored" and d.suggested_layer_ids == [2, 4, N]
    assert "root cause: ids ignored" in d.message and "at the top level of the draft config" in d.message
    single = diagnose_capture(_engine(golden, [2, 4, 5]), golden, [4], engine_convention="vllm",
                              config_ids=[3])
    assert single.kind == "ids_ignored" and "never arrived" not in single.message


def test_ids_read_but_wrong_are_not_ids_ignored(golden):
    # the config itself says [2, 4, 5] in vLLM's convention: the engine read it; the config is wrong
    d = diagnose_capture(_engine(golden, [2, 4, 5]), golden, [2, 4, N], engine_convention="vllm",
                         config_ids=[2, 4, 5])
    assert d.kind == "final_boundary_missing" and d.suggested_layer_ids == [2, 4, N]
    # without the config's ids there is no evidence the engine ignored them
    assert diagnose_capture(_engine(golden, [2, 4, 5]), golden, [2, 4, N]).kind == "final_boundary_missing"


def _fc_error(fed_slots: int, fc_slots: int, hidden: int = 16) -> str:
    """The error torch itself raises when fc gets the wrong number of aux slots."""
    fc = torch.nn.Linear(fc_slots * hidden, hidden, bias=False)
    with pytest.raises(RuntimeError) as err:
        fc(torch.zeros(5, fed_slots * hidden))
    return str(err.value)


@pytest.mark.parametrize("fed, ids, kind, needle", [
    (2, [-1, 3, 5], "embedding_missing", "ids [-1] match no layer"),
    (2, [1, 3, 4], "engine_crash", "some ids match no captured layer"),
    (3, [3], "ids_ignored", "captured more layers than the config's ids [3] name"),
])
def test_crash_diagnosis_reads_the_fc_width_error(fed: int, ids: list[int], kind: str, needle: str) -> None:
    d = crash_diagnosis(_fc_error(fed, len(ids)), ids, target_hidden=16)
    assert d.kind == kind and needle in d.message
    assert d.details == {"fed_slots": fed, "fc_slots": len(ids)}


@pytest.mark.parametrize("convention, fix", [("vllm", None), ("eagle3-original", [0, 4, 6])])
def test_crash_on_a_dropped_embedding_names_the_fix_only_where_the_rule_can_feed_it(
        convention: str, fix: list[int] | None) -> None:
    """-1 dropped by a b = id engine: where its rule captures boundary 0 (id 0), those ids fix
    it; vLLM's deepseek path cannot capture boundary 0 at all, so no id list is offered."""
    d = crash_diagnosis(_fc_error(2, 3), [-1, 3, 5], target_hidden=16, engine_convention=convention,
                        training_boundaries=[0, 4, 6], num_layers=8)
    assert d.kind == "embedding_missing" and d.suggested_layer_ids == fix
    assert (f"ids {fix}" in d.message) if fix else "cannot express it" in d.message


def _view_error(fed_slots: int, fc_slots: int, tokens: int = 5, hidden: int = 16) -> str:
    """The error torch itself raises where a drafter reshapes its aux input to fc's width."""
    with pytest.raises(RuntimeError) as err:
        torch.zeros(tokens, fed_slots * hidden).view(-1, fc_slots * hidden)
    return str(err.value)


def test_crash_diagnosis_reads_the_reshape_error() -> None:
    """vLLM 0.32 on an AMD EPYC CPU fails at the reshape, not the matmul: the fed width is not in
    that message, only that it is not fc's; with a negative id in the config the embedding's
    slot is the one dropped. Without one no cause is named."""
    d = crash_diagnosis(_view_error(2, 3), [-1, 3, 5], target_hidden=16)
    assert d.kind == "embedding_missing" and "ids [-1] match no layer" in d.message, d.message
    assert d.details == {"fed_slots": None, "fc_slots": 3}
    assert crash_diagnosis(_view_error(2, 3), [1, 3, 4], target_hidden=16).kind == "engine_crash"


def test_crash_diagnosis_reads_vllms_cpu_gemm_error() -> None:
    """vLLM 0.32 on a CPU with AMX tiles runs a bf16 fc through its own packed GEMM, whose width
    check words the mismatch its own way (fed width, then fc's). The message comes from that
    kernel itself, run here with two slots fed to an fc built for three."""
    try:
        from vllm import _custom_ops as ops  # loads vLLM's kernels into torch.ops._C
    except ImportError as err:
        pytest.skip(f"vLLM is not installed here ({err}); `pip install -e .[vllm]` runs this")
    if not torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has no AMX tiles, so vLLM never picks its packed GEMM here")
    packed = torch.ops._C.convert_weight_packed(torch.zeros(128, 3 * 128, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError) as err:
        ops.weight_packed_linear_cpu(torch.zeros(5, 2 * 128, dtype=torch.bfloat16), packed, 128, None)
    d = crash_diagnosis(f"vLLM failed during capture: RuntimeError: {err.value}", [-1, 3, 5], target_hidden=128)
    assert d.kind == "embedding_missing" and "ids [-1] match no layer" in d.message, (str(err.value), d.message)
    assert d.details == {"fed_slots": 2, "fc_slots": 3}
    assert crash_diagnosis(str(err.value), [1, 3, 4], target_hidden=128).kind == "engine_crash"


def test_crash_diagnosis_of_an_unrelated_error() -> None:
    d = crash_diagnosis("CUDA out of memory\nmore", [1, 3, 4], target_hidden=16)
    assert d.kind == "engine_crash" and d.message == "the engine failed serving this draft: CUDA out of memory"


def test_offset_past_a_kept_embedding(golden):
    """An engine that honours "-1 = embedding" but reads every other id one boundary early:
    one cause, not "unknown". The config's ids [-1, 3, 5] already mean training's boundaries in
    the convention the engine declares, so the remedy is the engine's capture, addressed to its
    vendor, not "set the ids" the config already holds (issue #31, item 3). Those boundaries are
    also that convention's defaults: ids ignored fits as well, and the report says so."""
    d = diagnose_capture(_engine(golden, [0, 3, 5]), golden, EMBED_FIRST, engine_convention="embedding-minus-one",
                         config_ids=[-1, 3, 5])
    assert d.kind == "offset" and d.offset == -1 and d.suggested_layer_ids is None
    assert "every slot but the embedding is 1 boundary earlier" in d.message
    assert "embedding is lost" not in d.message
    assert d.to_json()["addressee"] == "engine vendor"
    assert "its hook reads the layer's input, not its output" in d.message, d.message
    assert d.details["ambiguous_with"] == "ids_ignored", d.details.get("comparison")


def test_offset_stopped_at_the_final_boundary(golden):
    """A +1 engine on a draft trained on [2, 4, N]: the last id has no boundary beyond N, so
    that slot keeps b = N while the others shift. Still one cause, with the right fix."""
    d = diagnose_capture(_engine(golden, [3, 5, N]), golden, [2, 4, N], engine_convention="sglang",
                         config_ids=[1, 3, 7])
    assert d.kind == "offset" and d.offset == 1
    assert "every slot but the final boundary is 1 boundary later" in d.message


# -- issue #13: causes named from fitted evidence, never by elimination ----------------------


def _noisy(scale: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def slot(b: int):
        def make(g):
            x = g.boundaries[b]
            return x + scale * x.norm(dim=-1, keepdim=True) / x.shape[-1] ** 0.5 * torch.randn(
                x.shape, generator=gen)
        return make
    return slot


@pytest.mark.parametrize("train", [EMBED_FIRST, WITH_FINAL, SPECFORGE])
def test_uniform_small_error_is_precision_loss_not_a_missing_endpoint(golden, train):
    """The issue's example: 3e-3 noise on every aux state was named embedding_missing on the
    embedding-first draft and final_boundary_missing on final-aux."""
    slot = _noisy(3e-3)
    d = diagnose_capture(_engine(golden, [slot(b) for b in train]), golden, train)
    assert d.kind == "precision_loss", d.message
    assert d.details["confidence_margin"] > 1 and "Confidence margin" in d.message
    bf16 = [aux_features(g, train).bfloat16().float() for g in golden]
    assert diagnose_capture(bf16, golden, train).kind == "precision_loss"


def test_an_endpoint_slot_matching_nothing_is_not_missing(golden):
    noise = torch.Generator().manual_seed(1)
    features = _engine(golden, [lambda g: torch.randn(g.boundaries[0].shape, generator=noise), 4, 6])
    assert diagnose_capture(features, golden, EMBED_FIRST).kind == "unrecognised"


def test_normalised(golden):
    gain = torch.linspace(0.5, 1.5, golden[0].boundaries.shape[-1])
    d = diagnose_capture(_engine(golden, [lambda g: torch.nn.functional.rms_norm(
        g.boundaries[2], (g.boundaries.shape[-1],), gain, 1e-6), 4, 5]), golden, SPECFORGE)
    assert d.kind == "normalised" and d.details["evidence"]["slots"] == [0]


def test_partial_residual(golden):
    d = diagnose_capture(_engine(golden, [2, lambda g: g.boundaries[4] - g.mlp_out[4], 5]), golden, SPECFORGE)
    assert d.kind == "partial_residual"


def test_position_shifted(golden):
    late = [lambda g, b=b: torch.nn.functional.pad(g.boundaries[b], (0, 0, 1, 0))[:-1] for b in SPECFORGE]
    d = diagnose_capture(_engine(golden, late), golden, SPECFORGE)
    assert d.kind == "position_shifted" and d.details["evidence"]["shift"] == 1


def test_slots_aliased_and_interleaved(golden):
    assert diagnose_capture(_engine(golden, [5, 5, 5]), golden, SPECFORGE).kind == "slots_aliased"
    inter = [torch.stack([g.boundaries[b] for b in SPECFORGE], -1).flatten(-2) for g in golden]
    assert diagnose_capture(inter, golden, SPECFORGE).kind == "slots_interleaved"


def test_request_mixed_and_batch_dependent(golden):
    right = [aux_features(g, SPECFORGE) for g in golden]
    n = min(r.shape[0] for r in right)
    swapped = [torch.cat([right[1][:n], right[0][n:]]), right[0][:right[1].shape[0]]]
    d = diagnose_capture(swapped, golden, SPECFORGE)
    assert d.kind == "request_mixed", d.message
    leaked = _engine(golden, [_noisy(0.1)(b) for b in SPECFORGE])
    assert diagnose_capture(leaked, golden, SPECFORGE, alone=right).kind == "batch_dependent"
    # without the solo captures nothing fits a 10% error: no class by elimination
    assert diagnose_capture(leaked, golden, SPECFORGE).kind == "unrecognised"


def test_embedding_only_capture_is_named_by_the_probe() -> None:
    """Ids meaning [0] fed boundary 1 fit a shift of every id and a dropped embedding alike;
    the probe [0, 4] decides: [1, 5] is the offset, [1, 4] the lost embedding, and a probe
    showing something else leaves the diagnosis as it was."""
    from harness.diagnosis.capture import embedding_only, embedding_or_shift
    from harness.diagnosis.record import Diagnosis

    def diag(kind: str, found: list, train: list, offset: int | None = None) -> Diagnosis:
        return Diagnosis(kind=kind, message=f"{kind} seen", engine_boundaries=found,
                         training_boundaries=train, suggested_layer_ids=[1] if kind == "offset" else None,
                         offset=offset)

    shrunk = diag("offset", [1], [0], offset=1)
    assert embedding_only(shrunk) and not embedding_only(diag("offset", [3, 5], [2, 4], 1))
    shifted = embedding_or_shift(shrunk, diag("offset", [1, 5], [0, 4], offset=1))
    assert shifted.kind == "offset" and shifted.offset == 1 and "probe" in shifted.details
    dropped = embedding_or_shift(shrunk, diag("embedding_missing", [1, 4], [0, 4]))
    assert dropped.kind == "embedding_missing" and dropped.suggested_layer_ids is None
    assert "only the embedding slot is off" in dropped.message
    assert embedding_or_shift(shrunk, diag("unrecognised", [None, None], [0, 4])) is shrunk


def test_a_batch_that_changes_nothing_is_not_batch_dependent(golden):
    """Solo captures equal to the batch's (no prompt differs beyond rtol) are no evidence of a
    batch leak: the CPU fp16 selftest named aux_rounded_bf16 batch_dependent with 'prompts []
    differ' and a margin of 0.0765."""
    from harness.diagnosis.evidence import batch_dependence

    features = _engine(golden, [_noisy(3e-3)(b) for b in SPECFORGE])
    assert batch_dependence(features, [x.clone() for x in features], golden, SPECFORGE,
                            1e-3) is None
    d = diagnose_capture(features, golden, SPECFORGE, alone=[x.clone() for x in features])
    assert d.kind == "precision_loss", d.message


def test_a_one_id_shift_or_a_fault_at_that_boundary_is_decided_by_a_probe(golden):
    """A failing layer-id example shrinks to one id: [3] held as boundary 4 fits "every id read
    one late" and "boundary 3 alone captured wrong" equally, so the comparison says ambiguous.
    The probe [3, 4] (that boundary and a middle one) decides: [4, 5] is the shift, [4, 4] the
    fault at boundary 3 alone; anything else leaves the ambiguity as it was."""
    from harness.diagnosis.capture import separating_probe, shift_or_local

    one = diagnose_capture(_engine(golden, [4]), golden, [3])
    assert one.kind in ("offset", "unrecognised") and "ambiguous_with" in one.details, one.message
    probe_b = separating_probe(one, N)
    assert probe_b == (3, N // 2)
    shifted = shift_or_local(one, diagnose_capture(_engine(golden, [4, 5]), golden, list(probe_b)))
    assert shifted.kind == "offset" and shifted.offset == 1 and "ambiguous_with" not in shifted.details
    assert shifted.details["separated_by"] == "probe" and "holds [4, 5]" in shifted.message
    local = shift_or_local(one, diagnose_capture(_engine(golden, [4, 4]), golden, list(probe_b)))
    assert local.kind == "unrecognised" and "a capture fault at boundary 3 alone" in local.message
    assert "ambiguous_with" not in local.details
    other = diagnose_capture(_engine(golden, [6, 2]), golden, list(probe_b))
    assert shift_or_local(one, other) is one
    # a decided diagnosis asks for no probe
    assert separating_probe(diagnose_capture(_engine(golden, [3, 5, 6]), golden, SPECFORGE), N) is None


def test_one_shared_buffer_or_a_fault_at_one_boundary_is_decided_by_a_single_slot(golden):
    """Two slots trained on [2, 5] both holding boundary 5 fit "one buffer every capture
    overwrites" and "boundary 2 alone captured wrong" equally. Boundary 2 served as a draft of
    one slot decides: held as trained, the buffer was shared; held as 5, the fault is its own."""
    from harness.diagnosis.capture import separating_probe, shift_or_local

    two = diagnose_capture(_engine(golden, [5, 5]), golden, [2, 5])
    assert {two.kind, two.details.get("ambiguous_with")} >= {"slots_aliased"}, two.message
    assert separating_probe(two, N) == (2,)
    shared = shift_or_local(two, diagnose_capture(_engine(golden, [2]), golden, [2]))
    assert shared.kind == "slots_aliased" and shared.details["separated_by"] == "probe"
    assert "served alone is captured as trained" in shared.message
    own = shift_or_local(two, diagnose_capture(_engine(golden, [5]), golden, [2]))
    assert own.kind == "unrecognised" and "a capture fault at boundary 2 alone" in own.message
    assert "ambiguous_with" not in own.details
    assert shift_or_local(two, diagnose_capture(_engine(golden, [3]), golden, [2])) is two
