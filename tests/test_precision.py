"""The reduced-precision judgement never cries wolf on the control and never goes blind to a
wiring bug.

The pinned prompts are hard cases for any fixed per-token bound: each holds a token whose bf16
error on the CPU is beyond 5e-2 (0.35 to 1.37 here), found on the committed bundle by
`benchmarks/false_alarms.py --dtype bfloat16 --prompts 120` (its `hard_cases`: prompts the
judgement passes whose worst token is beyond the fixed bound, two per draft, distinct;
docs/figures/cpu_seed14_false_alarms_bf16.json; the decorrelated target's layers partly cancel
their input, which amplifies bf16 error).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch

from harness.core.tolerances import tolerance_for
from harness.diagnosis.identity import AMBIGUOUS, EXACT, ROUTING_TIE, WRONG, classify_tokens
from harness.engines.base import EngineOptions
from harness.engines.reference import ReferenceEngine
from harness.golden.bundle import load_bundle
from harness.golden.envelope import Envelope
from harness.golden.features import TargetFeatures, relative_errors
from harness.golden.oracle import Oracle
from harness.golden.paths import default_bundle_path
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches,
    assert_capture_matches_oracle,
    assert_fc_matches,
    batch_leaks,
    near_tie_bound,
)

FALSE_ALARMS = [
    ("specforge-default", [99, 283, 496, 327, 504, 45, 431, 374, 69, 508, 10, 208, 489, 350, 216, 164, 4, 112, 10, 370,
                     389, 4, 504, 424, 348, 273, 316]),
    ("specforge-default", [37, 423, 34, 179, 500, 342, 219, 72, 459, 475, 113, 232, 225, 75, 186, 162, 93, 335, 171, 375,
                     508]),
    ("embed-first", [223, 354, 216, 18, 257, 473, 445, 495, 169, 372, 132, 43, 183, 39, 65, 186, 357, 18, 179, 181,
                     94, 8, 428, 501, 121, 422, 190, 39, 308]),
    ("embed-first", [218, 156, 284, 216, 382, 477, 75, 305, 219]),
    ("final-aux", [483, 293, 468, 437, 24, 436, 386, 495, 362, 314, 338, 256, 367, 332, 465, 237, 330, 225, 193,
                     449, 278, 94, 109, 195]),
    ("final-aux", [496, 412, 311, 283, 303, 150, 230, 49, 308, 411, 200, 165, 297, 126]),
]
LONG = 24  # tokens of the prompt the synthetic wiring bugs are built on


@cache
def _oracle() -> Oracle:
    return Oracle(load_bundle(default_bundle_path(), verify_hashes=False))


@cache
def _engine(draft: str) -> ReferenceEngine:
    b = _oracle().bundle
    return ReferenceEngine(b.target_dir, b.draft_dir(draft),
                           EngineOptions(dtype="bfloat16", training_convention=b.draft(draft).convention))


def _judge(features, prompt, draft, dtype="bfloat16", boundaries=None):
    o = _oracle()
    ctx = CaptureContext(training_boundaries=boundaries or o.spec(draft).boundaries,
                         config_ids=o.spec(draft).layer_ids, dtype=dtype, engine_name="reference",
                         draft=draft, check="test_precision")
    return assert_capture_matches_oracle(ctx, features=features, oracle=o, prompts=[prompt])


@pytest.mark.parametrize(("draft", "prompt"), FALSE_ALARMS, ids=lambda v: str(v)[:24])
def test_former_false_alarms_of_the_bf16_control_pass(draft: str, prompt: list[int]) -> None:
    features = _engine(draft).capture([prompt]).features
    diag = _judge(features, prompt, draft)
    assert diag.kind == "ok", diag.message  # never "capture skipped" for a correct engine
    worst = diag.details["precision"]["worst_rel_error"]
    assert worst > tolerance_for("bfloat16").rtol, "not a hard case: no token beyond 5e-2"
    with pytest.raises(ConformanceFailure, match=r"<= 0.001 on every token"):
        _judge(features, prompt, draft, dtype="float32")  # fp32 keeps its strict bound


def _bf16(prompt: list[int], slots) -> list[torch.Tensor]:
    g = _oracle().features(prompt)
    chunks = [g.boundaries[s] if isinstance(s, int) else s(g) for s in slots]
    return [torch.cat(chunks, -1).bfloat16().float()]


# (what the engine hands, in training's slot order [2, 4, 5] of specforge-default, the kind)
WIRING_BUGS = [
    ([1, 3, 4], "offset"),
    ([2, 5, 4], "order_permuted"),
    ([2, lambda g: torch.zeros_like(g.boundaries[4]), 5], "stale_or_skipped"),
    ([2, lambda g: g.mlp_out[4], 5], "residual_missing"),
]


@pytest.mark.parametrize(("slots", "kind"), WIRING_BUGS, ids=[k for _, k in WIRING_BUGS])
def test_wiring_bugs_in_bf16_fail_with_their_diagnosis(slots, kind: str) -> None:
    prompt = max(_oracle().pinned_prompts, key=len)[:LONG]
    with pytest.raises(ConformanceFailure, match=r"not the training boundaries on [1-9]\d*/") as err:
        _judge(_bf16(prompt, slots), prompt, "specforge-default")
    assert err.value.diagnoses[0].kind == kind, err.value.diagnoses[0].message


def test_a_post_norm_final_boundary_in_bf16_fails() -> None:
    prompt = max(_oracle().pinned_prompts, key=len)[:LONG]
    with pytest.raises(ConformanceFailure) as err:
        _judge(_bf16(prompt, [2, 4, lambda g: g.final_normed]), prompt, "final-aux")
    assert err.value.diagnoses[0].kind == "final_boundary_normed", err.value.diagnoses[0].message


def test_a_slot_drifting_beyond_the_noise_floor_fails() -> None:
    """Every token a little off (a wrong norm epsilon, a scale): identity alone would pass it,
    the slot's median error against the noise floor does not."""
    prompt = max(_oracle().pinned_prompts, key=len)[:LONG]
    features = _bf16(prompt, [2, 4, lambda g: g.boundaries[5] * 1.05])
    with pytest.raises(ConformanceFailure, match=r"drifting beyond the bfloat16 precision envelope: slot 2"):
        _judge(features, prompt, "specforge-default")


def test_precision_ambiguity_is_reported_as_ambiguous_not_as_a_bug() -> None:
    """A token where the same-dtype reference is itself no nearer its boundary than zero is one
    precision cannot decide: ambiguous, whatever the engine holds there, unless zeros."""
    g = _oracle().features([251, 133])
    x = g.boundaries[5] + 2 * g.boundaries[5].norm(dim=-1, keepdim=True) * torch.randn_like(g.boundaries[5]) / 11
    undecided = _one_member(g, 5, g.boundaries[5] * -0.5)  # error 1.5: rounded to nothing
    tc = classify_tokens(x, g, 5, undecided, noise_factor=2, separation=2, floor=1e-3)
    assert tc.classes == [AMBIGUOUS, AMBIGUOUS]
    tc = classify_tokens(torch.zeros_like(x), g, 5, undecided, noise_factor=2, separation=2, floor=1e-3)
    assert tc.classes == [WRONG, WRONG]
    rounded = g.boundaries[5].bfloat16().float()
    tc = classify_tokens(rounded, g, 5, _one_member(g, 5, rounded), noise_factor=2, separation=2,
                         floor=1e-3)
    assert tc.classes == [EXACT, EXACT]


def _one_member(g: TargetFeatures, b: int, state: torch.Tensor,
                ties: torch.Tensor | None = None) -> Envelope:
    """An envelope of one implementation that differs from training only at boundary b."""
    boundaries = g.boundaries.clone()
    boundaries[b] = state
    shape = g.boundaries.shape[:2]
    return Envelope({"m": TargetFeatures(boundaries, g.final_normed, g.mlp_out, None)},
                    ties=torch.zeros(shape, dtype=torch.bool) if ties is None else ties,
                    margin=torch.full(shape, float("inf")), spread=torch.full(shape, float("inf")))


def test_a_routing_tie_is_ambiguous_never_wrong_and_never_exact() -> None:
    """A token whose MoE routing correct implementations disagree on is evidence of neither a
    bug nor a pass once it leaves the allowance: the other state it lands on is what a swapped
    expert gives (routing_tie). Within the allowance it is evidence like any token (exact);
    zeros stay wrong."""
    g = _oracle().features([251, 133, 97])
    rounded = g.boundaries[5].bfloat16().float()
    ties = torch.zeros(g.boundaries.shape[:2], dtype=torch.bool)
    ties[5:, 1] = True
    env = _one_member(g, 5, rounded, ties)
    x = rounded.clone()
    x[1] = g.boundaries[4][1]  # token 1 clearly another boundary
    x[2] = g.boundaries[4][2]  # token 2 too, but its routing is not in doubt
    kw = dict(noise_factor=2, separation=2, floor=1e-3)
    assert classify_tokens(x, g, 5, env, **kw).classes == [EXACT, ROUTING_TIE, WRONG]
    assert classify_tokens(rounded, g, 5, env, **kw).classes == [EXACT, EXACT, EXACT]
    x[1] = 0
    assert classify_tokens(x, g, 5, env, **kw).classes[1] == WRONG


def test_the_envelope_is_correct_implementations_computed() -> None:
    """The floor is computed, not assumed: the envelope holds the transformers bf16 target
    (the reference engine's own computation) and the other implementations; its error at each
    token is the largest of theirs; the embedding only rounds (within one bf16 unit) while the
    deeper boundaries of the hardest pinned prompt move beyond the fixed 5e-2, which is why a
    fixed bound would fail the control there."""
    o = _oracle()
    p = FALSE_ALARMS[0][1]
    env = o.envelope(p, "bfloat16")
    assert {"transformers", "all-reduced", "residual-fp32", "experts-in-order"} <= set(env.names)
    golden = o.features(p)
    for b in (0, golden.num_layers):
        each = torch.stack([relative_errors(f.boundaries[b], golden.boundaries[b])
                            for f in env.members.values()])
        assert torch.equal(env.error(b, golden), each.amax(0))
    assert 0 < float(env.error(0, golden).max()) <= tolerance_for("bfloat16").unit
    assert max(float(env.error(b, golden).max()) for b in range(1, golden.num_layers + 1)) \
        > tolerance_for("bfloat16").rtol
    # members differ from one another: an envelope of one computation would be a point
    deep = env.states(golden.num_layers)
    assert float((deep[0] - deep[-1]).abs().max()) > 0


def test_missing_noise_floor_is_a_clear_error() -> None:
    prompt = [251]
    o = _oracle()
    with pytest.raises(ValueError, match=r"needs the bfloat16 precision envelope"):
        assert_capture_matches(CaptureContext(training_boundaries=(2, 4, 5), config_ids=(1, 3, 4),
                                              dtype="bfloat16", engine_name="x", draft="d", check="c"),
                               features=_bf16(prompt, [2, 4, 5]), golden=[o.features(prompt)],
                               prompts=[prompt])


def test_bf16_fc_is_judged_against_the_same_dtype_fc() -> None:
    o, draft = _oracle(), "specforge-default"
    prompt = max(o.pinned_prompts, key=len)
    cap = _engine(draft).capture([prompt])
    cfg = o.draft(draft).cfg
    kwargs = dict(features=cap.features, expected=[o.fc(draft, cap.features[0])], dtype="bfloat16",
                  draft_hidden=cfg.hidden_size, norm_before_fc=cfg.norm_before_fc, fc_norm=cfg.fc_norm,
                  engine_name="reference", draft=draft, prompts=[prompt],
                  same_dtype=[o.reference_fc(draft, cap.features[0], "bfloat16")])
    assert_fc_matches(fc_out=cap.fc_out, **kwargs)
    with pytest.raises(ConformanceFailure, match=r"differs from fc\(features\)"):
        assert_fc_matches(fc_out=[cap.fc_out[0] * 1.1], **kwargs)


def test_batch_leaks_need_a_difference_beyond_noise_and_a_wrong_state() -> None:
    o = _oracle()
    prompt = max(o.pinned_prompts, key=len)[:LONG]
    alone = _bf16(prompt, [2, 4, 5])[0]
    noisy = alone * (1 + 1e-3)
    assert batch_leaks(noisy, alone, dtype="bfloat16", golden=o.features(prompt),
                       envelope=o.envelope(prompt, "bfloat16"))[0] == 0
    leaked = alone.clone()
    leaked[5:] = torch.cat([o.features(prompt).boundaries[b][:LONG - 5].flip(0) for b in (2, 4, 5)], -1)
    bad, total, _, _ = batch_leaks(leaked, alone, dtype="bfloat16", golden=o.features(prompt),
                                   envelope=o.envelope(prompt, "bfloat16"))
    assert 0 < bad <= total - 5
    assert batch_leaks(noisy, alone, dtype="float32")[0] == LONG  # fp32: strict


def test_batch_invariance_of_a_miswired_engine_is_judged_on_its_own_boundaries() -> None:
    """An engine one boundary early (vLLM's offset) that rounds differently inside a batch is
    batch invariant: the capture check, not this one, names its offset."""
    o = _oracle()
    prompt = max(o.pinned_prompts, key=len)[:LONG]
    alone = _bf16(prompt, [1, 3, 4])[0]
    torch.manual_seed(0)
    inside = alone + 0.03 * alone.norm(dim=-1, keepdim=True) * torch.randn_like(alone) / alone.shape[-1] ** 0.5
    assert batch_leaks(inside, alone, dtype="bfloat16", golden=o.features(prompt),
                       envelope=o.envelope(prompt, "bfloat16"))[0] == 0


def test_near_tie_bound_adds_the_measured_bf16_logit_noise() -> None:
    o = _oracle()
    ctx = max(o.pinned_prompts, key=len)[:10]
    logits, top = o.top2_logits(ctx)
    gap32, bound32 = near_tie_bound(o, ctx, top.tolist(), "float32")
    gap16, bound16 = near_tie_bound(o, ctx, top.tolist(), "bfloat16")
    assert gap32 == gap16 == pytest.approx(float(logits[top[0]] - logits[top[1]]))
    assert bound32 == tolerance_for("float32").near_tie < bound16
    low = o.reference_logits(ctx, "bfloat16", "cpu")
    moved = float((low[top] - logits[top]).abs().sum())
    assert bound16 >= tolerance_for("bfloat16").noise_factor * moved


# (mutant, draft): zoo mutants whose bf16 capture the diagnosis misnamed in the first full
# bf16 selftest (CPU, this bundle): a correct slot's few tokens that precision leaves
# unseparated read as "stale" and outvoted the permutation, the aliasing or the fitted cause
# (slots_descending, aux_buffer_aliased, aux_residual_only, final_missing, config_ids_ignored
# -> stale_or_skipped; aux_batch_leak -> stale_or_skipped or unrecognised). On this pinned
# batch the previous code named 23 of the 57 failing (capture mutant, draft) cells wrongly,
# the ones below among them (aux_after_input_norm on final-aux: its normed slots were taken
# for a normed final boundary)
BF16_MUTANTS = [
    ("slots_descending", "specforge-default"),
    ("aux_buffer_aliased", "specforge-default"),
    ("aux_buffer_aliased", "final-aux"),
    ("aux_residual_only", "specforge-default"),
    ("final_missing", "final-aux"),
    ("config_ids_ignored", "final-aux"),
    ("residual_missing", "specforge-default"),
    ("aux_after_input_norm", "specforge-default"),
    ("aux_after_input_norm", "final-aux"),
    ("embedding_dropped", "embed-first"),
    ("aux_rows_one_late", "specforge-default"),
    ("aux_slots_interleaved", "specforge-default"),
    ("aux_batch_leak", "specforge-default"),
    ("aux_batch_leak", "single-aux"),
]


@pytest.mark.parametrize(("key", "draft"), BF16_MUTANTS, ids=[f"{k}-{d}" for k, d in BF16_MUTANTS])
def test_bf16_mutant_captures_are_named_exactly(key: str, draft: str) -> None:
    """Real bf16 captures of the zoo's wiring bugs, judged as the capture check judges them
    (pinned prompts in one batch, each prompt alone as the batch evidence): the diagnosis is
    the mutant's own class, not a skipped capture read off precision's ambiguous tokens."""
    from harness.engines.zoo import MUTANTS
    from harness.tools.mutant_scan import bundle_drafts, named

    o = _oracle()
    served = next(d for d in bundle_drafts(o) if d.name == draft)
    kind, message = named(o, MUTANTS[key], served, "bfloat16")
    assert kind == MUTANTS[key].expected_diagnosis_kind, message


# (mutant, boundaries): the layer-id check's factory drafts that the first bf16 selftest on
# the final diagnosis of session 5 (H200 host CPU: mutation score 1.00, diagnosis 0.94) and
# then benchmarks/diagnosis_scan.py --configs found misnamed. A single slot holding a state no
# golden boundary is (a residual without its MLP update, a layer's input-normed state) was
# named after its nearest golden state (the embedding: "offset -1"; the final norm's output:
# "final boundary normed") although that state was 0.3-0.8 away on the median token; a
# normed boundary 1 captured alone was "identified" as trained on its few decidable tokens, so
# the batch looked to blame. The last two cases are the same in fp32: an all-slots-equal
# capture [1, 8] -> [8, 8] read as "offset +7".
CONFIG_MUTANTS = [
    ("aux_residual_only", (1,), "bfloat16"),
    ("aux_residual_only", (7,), "bfloat16"),
    ("aux_residual_only", (8,), "bfloat16"),
    ("aux_residual_only", (1, 8), "bfloat16"),
    ("aux_after_input_norm", (1,), "bfloat16"),
    ("aux_after_input_norm", (5,), "bfloat16"),
    ("aux_after_input_norm", (7,), "bfloat16"),
    ("aux_after_input_norm", (1, 8), "bfloat16"),
    ("aux_buffer_aliased", (1, 8), "bfloat16"),
    ("aux_buffer_aliased", (1, 8), "float32"),
]


@pytest.mark.parametrize(("key", "bounds", "dtype"), CONFIG_MUTANTS,
                         ids=[f"{k}-{list(b)}-{d}" for k, b, d in CONFIG_MUTANTS])
def test_layer_id_config_captures_are_named_exactly(key: str, bounds: tuple[int, ...], dtype: str,
                                                    tmp_path: Path) -> None:
    """The same judgement on drafts the layer-id check draws (harness.tools.mutant_scan.factory_drafts)."""
    from harness.engines.zoo import MUTANTS
    from harness.tools.mutant_scan import factory_drafts, named

    o = _oracle()
    served = next(d for d in factory_drafts(o, tmp_path, [bounds]))
    kind, message = named(o, MUTANTS[key], served, dtype)
    assert kind == MUTANTS[key].expected_diagnosis_kind, message


@pytest.mark.parametrize("draft", ["specforge-default", "embed-first", "single-aux", "final-aux"])
def test_one_boundary_off_is_caught_on_every_draft_inside_the_envelope(draft: str) -> None:
    """Power kept: features a correct bf16 engine would hand over (the envelope's widest
    member), every slot one boundary early (one late for the embedding), judged against the
    envelope of the other members, fail on every draft."""
    o = _oracle()
    prompt = max(o.pinned_prompts, key=len)[:LONG]
    env = o.envelope(prompt, "bfloat16")
    state = env.members["all-reduced"]
    trained = o.spec(draft).boundaries
    feats = torch.cat([state.boundaries[b - 1 if b > 0 else 1] for b in trained], -1)
    with pytest.raises(ConformanceFailure, match=r"not the training boundaries"):
        assert_capture_matches(
            CaptureContext(training_boundaries=trained, config_ids=o.spec(draft).layer_ids,
                           dtype="bfloat16", engine_name="x", draft=draft, check="c"),
            features=[feats], golden=[o.features(prompt)], prompts=[prompt],
            envelopes=[env.without("all-reduced")])


def test_drift_needs_most_of_at_least_four_tokens() -> None:
    """A slot 5% off on every token is drift over a long prompt (test above) but not over two
    tokens: there its 'median' is a token's error, which the per-token judgement passed as a
    precision outlier clearly its own boundary (harness.core.tolerances.DRIFT_REASON)."""
    prompt = max(_oracle().pinned_prompts, key=len)[:2]
    _judge(_bf16(prompt, [2, 4, lambda g: g.boundaries[5] * 1.05]), prompt, "specforge-default")


@cache
def _fp16_engine(draft: str) -> ReferenceEngine:
    b = _oracle().bundle
    return ReferenceEngine(b.target_dir, b.draft_dir(draft),
                           EngineOptions(dtype="float16", training_convention=b.draft(draft).convention))


def test_an_fp16_engine_rounding_aux_states_through_bf16_is_a_precision_loss() -> None:
    """zoo:aux_rounded_bf16 in fp16 (the CPU fp16 selftest at 7ddbf38): every token stays
    nearest its own boundary, the embedding slot drifts ~10x past the fp16 envelope. It was
    named batch_dependent with no prompt differing in the batch (margin 0.0765, below 1) or
    unrecognised; fp16's rtol (0.02) is above bf16 rounding, so only the envelope tells it."""
    prompt = max(_oracle().pinned_prompts, key=len)
    fp16 = _fp16_engine("embed-first").capture([prompt]).features
    _judge(fp16, prompt, "embed-first", dtype="float16")  # the engine itself is correct
    rounded = [x.bfloat16().to(x.dtype) for x in fp16]
    with pytest.raises(ConformanceFailure, match="drifting beyond the float16 precision envelope") as err:
        _judge(rounded, prompt, "embed-first", dtype="float16")
    diag = err.value.diagnoses[0]
    assert diag.kind == "precision_loss", diag.message
    assert "the size of bf16 rounding" in diag.message and diag.details["confidence_margin"] > 1
    # all 32 pinned prompts at once, as the capture check serves them: fp16's own noise carries
    # one token to 0.053, past the per-token bound of a rounding; the typical token decides
    o = _oracle()
    every = [x.bfloat16().to(x.dtype) for x in _fp16_engine("embed-first").capture(o.pinned_prompts).features]
    ctx = CaptureContext(training_boundaries=o.spec("embed-first").boundaries,
                         config_ids=o.spec("embed-first").layer_ids, dtype="float16",
                         engine_name="reference", draft="embed-first", check="test_precision")
    with pytest.raises(ConformanceFailure) as err:
        assert_capture_matches_oracle(ctx, features=every, oracle=o, prompts=o.pinned_prompts)
    assert err.value.diagnoses[0].kind == "precision_loss", err.value.diagnoses[0].message


def test_a_small_rescale_is_not_named_a_precision_loss() -> None:
    """A slot scaled by 1.01 (a wrong norm epsilon, a scale) errs as much as bf16 rounding on
    every token, but along the state itself: one scalar per token removes it, which rounding
    noise spread over H channels never allows. Not a precision loss; whatever else fits."""
    prompt = max(_oracle().pinned_prompts, key=len)
    fp16 = _fp16_engine("embed-first").capture([prompt]).features
    h = _oracle().bundle.hidden_size
    scaled = [torch.cat([x[..., :h] * 1.01, x[..., h:]], -1) for x in fp16]
    with pytest.raises(ConformanceFailure) as err:
        _judge(scaled, prompt, "embed-first", dtype="float16")
    assert err.value.diagnoses[0].kind != "precision_loss", err.value.diagnoses[0].message
