"""The tolerance table: every bound has a row per dtype and a reason, and a dtype without a
row is a clear error wherever a bound is read (no silent default)."""

from __future__ import annotations

from dataclasses import fields

import pytest

from harness.cli import build_parser
from harness.core.tolerances import (
    DTYPES,
    REASONS,
    TOLERANCES,
    Tolerance,
    UnknownDtypeError,
    rtol_for,
    tolerance_for,
    tolerance_text,
)
from harness.judgement import precision
from harness.judgement.assertions import divergence


def test_every_bound_has_a_reason() -> None:
    assert set(REASONS) == {f.name for f in fields(Tolerance)}
    assert all(len(why) > 40 for why in REASONS.values())


def test_fp32_is_the_tightest_row() -> None:
    """fp32 differs from the fp32 reference by summation order only: strict, no noise floor."""
    fp32 = TOLERANCES["float32"]
    assert fp32.strict and fp32.noise_factor == 0 and fp32.separation == 0
    assert not any(row.strict for name, row in TOLERANCES.items() if name != "float32")
    for row in TOLERANCES.values():
        assert all(getattr(row, f.name) >= getattr(fp32, f.name) for f in fields(Tolerance))


@pytest.mark.parametrize("read", [rtol_for, tolerance_for, lambda d: tolerance_text(d, 8),
                                  lambda d: divergence(None, [1], [2], [3], d), precision.is_reduced])
def test_unknown_dtype_is_a_clear_error_everywhere(read) -> None:
    with pytest.raises(UnknownDtypeError, match=r"no tolerance for dtype 'int8'; use one of float32"):
        read("int8")


def test_torch_dtypes_are_read_by_name() -> None:
    torch = pytest.importorskip("torch")
    assert rtol_for(torch.bfloat16) == TOLERANCES["bfloat16"].rtol


def test_the_cli_offers_exactly_the_dtypes_with_bounds() -> None:
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    dtype = next(a for a in run._actions if a.dest == "dtype")
    assert tuple(dtype.choices) == DTYPES


def test_the_precision_branch_is_taken_in_one_place() -> None:
    """harness.judgement.precision decides fp32 against reduced precision for every check: fp32
    is the one strict dtype, and there no same-dtype evidence is asked for (an envelope or a
    reference-engine run costs seconds; fp32 has none to ask)."""
    assert [d for d in DTYPES if not precision.is_reduced(d)] == ["float32"]
    assert precision.traces_exact("float32") and not precision.traces_exact("bfloat16")
    assert precision.allowance_floor() == rtol_for("float32")

    def asked() -> float:
        raise AssertionError("fp32 asked for same-dtype evidence")

    assert precision.envelopes(None, [[1]], "float32") is None  # type: ignore[arg-type]
    assert precision.leak_evidence(None, [1], "float32") == (None, None)  # type: ignore[arg-type]
    assert precision.reference_fc(None, "d", [], "float32") is None  # type: ignore[arg-type]
    assert precision.same_dtype_acceptance("float32", asked) is None
    assert precision.trace_allowance(3.0, 1.0, "float32", asked) == (TOLERANCES["float32"].trace * 3.0, None)
    bf16 = TOLERANCES["bfloat16"]
    # reduced precision: the reference's own trace is measured only past the plain bound
    assert precision.trace_allowance(3.0, 0.0, "bfloat16", asked) == (bf16.trace * 3.0, None)
    allowed, own = precision.trace_allowance(3.0, 1.0, "bfloat16", lambda: 2.5)
    assert own == 2.5 and allowed == pytest.approx(bf16.trace * 3.0 + bf16.noise_factor * 0.5)
