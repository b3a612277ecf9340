"""Assertion helpers whose failure text explains: what was compared, the tolerance and why,
what the engine did instead (the diagnosis), and a minimal reproducer.

A check calls one of these and nothing else decides pass/fail: a `judge_*` function returns a
`Judgement` (harness.judgement.verdict: passed, measured, bound, why, the diagnosis computed
once), and the `assert_*` helpers raise it (`Judgement.verdict`); every check fails through
`fail` or a judgement's failure, so every failure is worded the same way, ends with the
command that reproduces it and carries its diagnoses into report.json. Tolerances come from
`harness.core.tolerances`, the fp32-or-reduced branch from `harness.judgement.precision`; the
wording of causes from `harness.diagnosis`.

One module per concern (capture, decode, fc, generation, layer ids, throughput) on a
common base; checks import the helpers from here.
"""

from __future__ import annotations

from harness.judgement.assertions.base import crash_failure, require
from harness.judgement.assertions.canary import assert_canary_accepts, canary_line, judge_canary
from harness.judgement.assertions.capture import (
    CaptureContext,
    assert_capture_matches,
    assert_capture_matches_oracle,
    batch_leaks,
    diagnose_batch_leak,
    judge_batch_invariance,
    judge_capture,
    judge_capture_oracle,
)
from harness.judgement.assertions.decode import (
    assert_decode_inputs_match,
    assert_history_independent,
    judge_decode_inputs,
)
from harness.judgement.assertions.fc import (
    assert_fc_matches,
    fc_allowances,
    judge_fc,
    worst_tokens,
)
from harness.judgement.assertions.generation import (
    divergence,
    judge_drafted_vocab,
    judge_generation_batch_invariance,
    judge_lossless,
    near_tie_bound,
)
from harness.judgement.assertions.layer_ids import assert_convention_as_declared, assert_fix_holds
from harness.judgement.assertions.throughput import (
    assert_speedup_consistent,
    judge_speedup_consistent,
)
from harness.judgement.verdict import Judgement, fail, failure
from harness.reports.report import ConformanceFailure

__all__ = ['CaptureContext', 'ConformanceFailure', 'Judgement', 'assert_canary_accepts', 'canary_line', 'assert_capture_matches', 'assert_capture_matches_oracle', 'assert_convention_as_declared', 'assert_decode_inputs_match', 'assert_fc_matches', 'assert_fix_holds', 'assert_history_independent', 'assert_speedup_consistent', 'batch_leaks', 'diagnose_batch_leak', 'crash_failure', 'divergence', 'fail', 'failure', 'fc_allowances', 'judge_batch_invariance', 'judge_canary', 'judge_capture', 'judge_capture_oracle', 'judge_decode_inputs', 'judge_drafted_vocab', 'judge_fc', 'judge_generation_batch_invariance', 'judge_lossless', 'judge_speedup_consistent', 'near_tie_bound', 'require', 'worst_tokens']
