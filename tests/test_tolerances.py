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
                                  lambda d: divergence(None, [1], [2], [3], d)])
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
