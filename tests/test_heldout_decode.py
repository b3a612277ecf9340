"""The held-out mutants of issue #31 item 6 outside the prefill capture (decode feeds, draft
positions, request history, the vocabulary map, a ragged batch, fc's weight) are caught by the
check that sees them and named acceptably: their true cause, or `unrecognised`, never a prefill
or fc kind with confidence (item 5). Each runs the smallest check that sees it, on
specforge-default in fp32 (a decode-input judgement is ~3 s, a history one ~1 s, fc and the
batched capture ~1 s)."""

from __future__ import annotations

from typing import Any

import pytest
from golden_oracle import committed_oracle

from harness.diagnosis.decode import diagnose_positions, feed_offsets
from harness.diagnosis.record import Diagnosis
from harness.engines.base import EngineOptions
from harness.engines.heldout import (
    HELDOUT,
    D2tAppliedTwice,
    DraftPositionsResetPerRound,
    FcColumnBlocksReversed,
    HeldOut,
    LeftPaddingMaskedFullWidth,
    PrefixCacheStaleAux,
    RefeedBonusRowStale,
    RefeedPathReversed,
    RefeedPositionsFromWindowEnd,
)
from harness.engines.reference import ReferenceEngine
from harness.engines.zoo import DecodeRowsOneLate, FcOnRecurrentState
from harness.judgement.acceptance import explain_shortfall, golden_traces, heldout_prompts
from harness.judgement.assertions import (
    CaptureContext,
    ConformanceFailure,
    assert_capture_matches_oracle,
    assert_decode_inputs_match,
    assert_fc_matches,
    assert_history_independent,
)

DRAFT = "specforge-default"


def _engine(cls: type[ReferenceEngine]) -> ReferenceEngine:
    oracle = committed_oracle()
    spec = oracle.spec(DRAFT)
    return cls(oracle.bundle.target_dir, oracle.bundle.draft_dir(DRAFT),
               EngineOptions(num_draft_tokens=spec.num_draft_tokens, training_convention=spec.convention))


def _decode_judgement(cls: type[ReferenceEngine]) -> Diagnosis | None:
    """suites/test_decode_inputs.py's judgement of `cls`: None where it passes."""
    oracle = committed_oracle()
    spec = oracle.spec(DRAFT)
    engine = _engine(cls)
    prompts = oracle.pinned_prompts
    try:
        decode = engine.decode_inputs(prompts, int(oracle.bundle.manifest["prompts"]["continuation_len"]))
    finally:
        engine.close()
    try:
        assert_decode_inputs_match(
            CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids, dtype="float32",
                           engine_name=cls.__name__, draft=DRAFT, check="heldout"),
            decode=decode, oracle=oracle, prompts=prompts)
    except ConformanceFailure as failed:
        (diag,) = failed.diagnoses
        return diag
    return None


def test_every_heldout_mutant_declares_where_it_shows() -> None:
    assert len(HELDOUT) >= 12
    for cls in HELDOUT.values():
        for where in (cls.shows_in, *cls.also_shows_in):
            assert where in ("capture", "batch", "acceptance", "fc", "decode", "history"), cls
        assert "unrecognised" in cls.acceptable, f"{cls.__name__}: 'unrecognised' is always acceptable"


@pytest.mark.parametrize(("cls", "kind", "pattern"), [
    (RefeedBonusRowStale, "decode_misaligned", "earlier positions' features only"),
    (RefeedPathReversed, "decode_misaligned", "swapped among themselves"),
    (DraftPositionsResetPerRound, "draft_positions_shifted", "starts again at position 0"),
    (RefeedPositionsFromWindowEnd, "draft_positions_shifted", "counted back from the end of the verify window"),
], ids=lambda x: x.__name__ if isinstance(x, type) else None)
def test_decode_mutants_are_caught_and_named_from_the_feeds(cls: type[HeldOut], kind: str,
                                                            pattern: str) -> None:
    """The decode-input check fails each and names it from the feeds: the re-fed rows partly
    misplaced were `stale_or_skipped` (a capture kind, its remedy about the capture) and the
    positions reset per round raised inside the diagnosis (kind "unknown")."""
    diag = _decode_judgement(cls)
    assert diag is not None, f"{cls.__name__}: the decode-input check passed"
    assert diag.kind in cls.acceptable and diag.kind == kind, f"{cls.__name__}: {diag.kind}: {diag.message}"
    assert pattern in diag.message, diag.message


@pytest.mark.parametrize(("cls", "expected"), [(DecodeRowsOneLate, "decode_misaligned"),
                                               (FcOnRecurrentState, None)],
                         ids=["zoo:decode_rows_one_late", "zoo:fc_on_recurrent_state"])
def test_zoo_decode_controls_keep_their_names(cls: type[ReferenceEngine], expected: str | None) -> None:
    """Rows all one late stay a systematic shift; fc re-applied to the recurrent state leaves
    every feed right, so the decode-input check passes it (its own check is acceptance)."""
    diag = _decode_judgement(cls)
    assert (diag.kind if diag else None) == expected, diag and diag.message
    if diag is not None:
        assert diag.details["systematic"] and "one row late" in diag.message, diag.message


def test_feeds_at_positions_no_cause_explains_are_unrecognised_not_a_crash() -> None:
    """Offsets that fit no fingerprint used to build a Diagnosis of kind "unknown", which is
    no kind: the check raised ValueError instead of failing with the evidence."""
    found = [feed_offsets([[0, 1, 2], [5], [4, 5], [13]], [[], [], [], []])]
    diag = diagnose_positions(found)
    assert diag is not None and diag.kind == "unrecognised", diag
    assert diag.details["confidence_margin"] == 0.0 and "offsets_after_prefill" in diag.details


def test_a_prefix_cache_serving_another_requests_aux_is_history_dependent() -> None:
    """suites/test_request_history.py's serving: the probes, three unrelated requests, the
    probes again in reverse order. Every prompt starts with BOS, so each request gets the aux
    rows of the one before it past the first token."""
    oracle = committed_oracle()
    engine = _engine(PrefixCacheStaleAux)

    def serve(prompts: list[list[int]]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {"features": [], "tokens": [], "traces": []}
        for prompt in prompts:
            out["features"].append(engine.capture([prompt]).features[0])
            gen = engine.generate([prompt], 16, True)
            out["tokens"].append(gen.tokens[0])
            out["traces"].append(gen.traces[0])
        return out

    probes = sorted(oracle.pinned_prompts, key=len)[-4:]
    try:
        first = serve(probes)
        serve(heldout_prompts(oracle)[:3])
        second = {k: v[::-1] for k, v in serve(probes[::-1]).items()}
    finally:
        engine.close()
    with pytest.raises(ConformanceFailure) as failed:
        assert_history_independent(
            prompts=probes, history="after 3 unrelated requests and in reverse order",
            features=(first["features"], second["features"]), tokens=(first["tokens"], second["tokens"]),
            traces=(first["traces"], second["traces"]), oracle=oracle, dtype="float32", device="cpu",
            engine_name="PrefixCacheStaleAux", draft=DRAFT, check="heldout")
    (diag,) = failed.value.diagnoses
    assert diag.kind in PrefixCacheStaleAux.acceptable and diag.kind == "history_dependent", diag.message


@pytest.mark.slow(reason="serves the pinned prompts and re-serves them with d2t read as ids (~10 s)")
def test_d2t_applied_twice_falls_short_and_is_not_named_d2t_absolute() -> None:
    """The map applied twice keeps every drafted token inside the draft vocabulary, so the
    vocabulary check passes; the exact fp32 trace falls short and the shortfall is
    `unrecognised`, not `d2t_absolute` (whose remedy, read d2t as offsets, is what it does)."""
    oracle = committed_oracle()
    engine = _engine(D2tAppliedTwice)
    try:
        gen = engine.generate(oracle.pinned_prompts, int(oracle.bundle.manifest["prompts"]["continuation_len"]), True)
        golden = golden_traces(oracle, DRAFT)
        assert gen.traces != golden, "the exact trace check passed D2tAppliedTwice"
        diag = explain_shortfall(engine, oracle, DRAFT, gen, golden)
    finally:
        engine.close()
    assert diag.kind in D2tAppliedTwice.acceptable, diag.message
    # it says what it checked, and no more: drafted tokens inside the draft vocabulary is not a
    # vocabulary map that matches training
    assert "vocabulary map match" not in diag.message, diag.message
    assert diag.kind != "unrecognised" or "d2t values themselves are not checked" in diag.message, diag.message


def test_left_padding_attended_in_a_batch_is_batch_dependent() -> None:
    """The capture check (a batch, each prompt alone as the evidence): shorter prompts of the
    left-padded batch attend to their padding, alone they are right."""
    oracle = committed_oracle()
    spec = oracle.spec(DRAFT)
    engine = _engine(LeftPaddingMaskedFullWidth)
    prompts = oracle.pinned_prompts
    try:
        with pytest.raises(ConformanceFailure) as failed:
            assert_capture_matches_oracle(
                CaptureContext(training_boundaries=spec.boundaries, config_ids=spec.layer_ids,
                               dtype="float32", engine_name="LeftPaddingMaskedFullWidth", draft=DRAFT,
                               check="heldout", in_batch=True,
                               alone=lambda some: [engine.capture([p]).features[0] for p in some]),
                features=engine.capture(prompts).features, oracle=oracle, prompts=prompts)
    finally:
        engine.close()
    (diag,) = failed.value.diagnoses
    assert diag.kind in LeftPaddingMaskedFullWidth.acceptable and diag.kind == "batch_dependent", diag.message


def test_fc_column_blocks_reversed_is_fc_wrong_on_a_right_capture() -> None:
    """suites/test_fc_projection.py's judgement: fc on the engine's own (right) features."""
    oracle = committed_oracle()
    engine = _engine(FcColumnBlocksReversed)
    try:
        capture = engine.capture(oracle.pinned_prompts)
    finally:
        engine.close()
    draft = oracle.draft(DRAFT)
    with pytest.raises(ConformanceFailure) as failed:
        assert_fc_matches(fc_out=capture.fc_out, features=capture.features,
                          expected=[oracle.fc(DRAFT, f) for f in capture.features], dtype="float32",
                          draft_hidden=draft.cfg.hidden_size, norm_before_fc=draft.cfg.norm_before_fc,
                          fc_norm=draft.cfg.fc_norm, engine_name="FcColumnBlocksReversed", draft=DRAFT,
                          prompts=oracle.pinned_prompts)
    (diag,) = failed.value.diagnoses
    assert diag.kind in FcColumnBlocksReversed.acceptable and diag.kind == "fc_wrong", diag.message


def _one_prompt(feeds: list[list[int]], steps: int = 3) -> list:
    """feed_offsets of one prompt whose feeds sit at `feeds`, each followed by `steps` drafted
    steps right after its last position."""
    return [feed_offsets(feeds, [list(range(f[-1] + 1, f[-1] + 1 + steps)) for f in feeds])]


def test_one_verify_round_cannot_tell_a_constant_shift_from_a_cache_not_rolled_back() -> None:
    """With one re-feed after the prefill, "every re-feed +3" and "the 3 drafted entries kept
    in the cache" predict the same positions: the diagnosis says ambiguous, names both and the
    experiment (more verify rounds), and is not counted confidently wrong whichever it leads
    with (issue #31: a verdict carries its margin)."""
    from harness.tools.mutant_scan import confidence

    found = _one_prompt([[0, 1, 2], [6, 7]]) + _one_prompt([[0, 1], [5, 6, 7]])
    diag = diagnose_positions(found)
    assert diag is not None and diag.kind in ("draft_positions_shifted", "draft_kv_not_rolled_back"), diag
    margin, runner_up, ambiguous = confidence(diag)
    assert ambiguous and margin == 0.0, diag.message
    assert {diag.kind, diag.details["ambiguous_with"].split(" ")[0]} == {
        "draft_positions_shifted", "draft_kv_not_rolled_back"}, diag.details
    assert "Ambiguous between" in diag.message and "two or more verify rounds" in diag.message, diag.message
    assert "root cause:" not in diag.message and "likeliest cause" in diag.message, diag.message


def test_a_second_verify_round_separates_them_and_the_margin_counts_the_refuting_feeds() -> None:
    """The same engines with two re-feeds: a cache not rolled back drifts (+3, +6), a constant
    shift stays (+3, +3). Each is named, not ambiguous, and its margin is the feeds that refute
    the other (one per prompt here)."""
    kept = diagnose_positions(_one_prompt([[0, 1, 2], [6, 7], [11, 12]]) + _one_prompt([[0, 1], [5, 6, 7], [11]]))
    assert kept is not None and kept.kind == "draft_kv_not_rolled_back", kept and kept.message
    assert "ambiguous_with" not in kept.details and kept.details["confidence_margin"] == 2.0, kept.details
    assert kept.details["comparison"]["runner_up"].startswith("draft_positions_shifted"), kept.details
    shifted = diagnose_positions(_one_prompt([[0, 1, 2], [6, 7], [8, 9]]) + _one_prompt([[0, 1], [5, 6, 7], [8]]))
    assert shifted is not None and shifted.kind == "draft_positions_shifted", shifted and shifted.message
    assert shifted.details["offset"] == 3 and shifted.details["confidence_margin"] == 2.0, shifted.details
    assert "Confidence margin: 2 of" in shifted.message, shifted.message
