"""The boundary model: every convention's table entry, round trips, and every refusal."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.core.boundaries import (
    CONVENTIONS,
    LayerIdError,
    boundaries_to_ids,
    get_convention,
    ids_to_boundaries,
    short_boundary,
)

REQUIRED = {"specforge", "eagle3-original", "embedding-minus-one", "sglang", "sglang-deepseek",
            "vllm", "trtllm", "llamacpp"}


def test_every_required_convention_is_there():
    assert REQUIRED <= set(CONVENTIONS)
    for name, conv in CONVENTIONS.items():
        assert conv.name == name and conv.description


@pytest.mark.parametrize("name,n,ids,boundaries", [
    ("specforge", 61, (1, 29, 57), (2, 30, 58)),
    ("specforge", 8, (1, 3, 4), (2, 4, 5)),
    ("eagle3-original", 61, (2, 30, 58), (2, 30, 58)),
    ("eagle3-original", 8, (2, 4, 5), (2, 4, 5)),
    ("embedding-minus-one", 61, (-1, 2, 30), (0, 3, 31)),
    ("embedding-minus-one", 8, (-1, 2, 4), (0, 3, 5)),
    ("sglang", 61, (1, 29, 57), (2, 30, 58)),
    ("sglang", 8, (1, 3, 4), (2, 4, 5)),
    ("sglang-deepseek", 61, (2, 30, 58), (2, 30, 58)),
    ("vllm", 61, (2, 30, 58), (2, 30, 58)),
    ("vllm", 8, (2, 4, 5), (2, 4, 5)),
    ("trtllm", 61, (1, 29, 57), (2, 30, 58)),
    ("trtllm", 8, (1, 3, 4), (2, 4, 5)),
    ("llamacpp", 61, (2, 30, 58), (2, 30, 58)),
])
def test_table_defaults(name, n, ids, boundaries):
    conv = get_convention(name)
    assert conv.default_ids(n) == ids
    assert conv.default_boundaries(n) == boundaries
    assert ids_to_boundaries(ids, name, n) == boundaries


@pytest.mark.parametrize("name,ids,boundaries", [
    ("specforge", [4, 1, 3], (5, 2, 4)),  # list order kept
    ("sglang", [4, 1, 3], (2, 4, 5)),  # ascending capture
    ("vllm", [5, 2, 4], (2, 4, 5)),
    ("trtllm", [4, 1], (2, 5)),
    ("embedding-minus-one", [3, -1, 5], (4, 0, 6)),
    ("sglang-deepseek", [1, 3, 4], (2, 4, 5)),  # first id 1: +1 for all
    ("sglang-deepseek", [2, 4, 5], (2, 4, 5)),  # first id not 1: b = id
    ("sglang-deepseek", [3, 1, 5], (1, 3, 5)),  # first id 3: the 1 is boundary 1
    ("vllm", [8], (8,)),  # deepseek_v2 captures the final boundary in 0.32
    ("vllm-llama", [0, 8], (0, 8)),
])
def test_mapping_and_order(name, ids, boundaries):
    assert ids_to_boundaries(ids, name, 8) == boundaries


def _capturable(name: str, n: int) -> list[int]:
    conv = get_convention(name)
    return [b for b in range(n + 1) if conv.can_capture(b, n)]


@st.composite
def _boundary_request(draw, name: str):
    n = draw(st.integers(1, 80))
    pool = _capturable(name, n)
    assume(pool)
    chosen = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=min(5, len(pool)), unique=True))
    if get_convention(name).sorts_ids:
        chosen = sorted(chosen)
    return n, chosen


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_boundaries_ids_boundaries_round_trip(name, data):
    n, chosen = data.draw(_boundary_request(name))
    try:
        ids = boundaries_to_ids(chosen, name, n)
    except LayerIdError:
        # the one known inexpressible set: SGLang deepseek (either release rule) with boundary 1 alone
        assert name in ("sglang-deepseek", "sglang-deepseek-stages") and chosen == [1]
        return
    assert ids_to_boundaries(ids, name, n) == tuple(chosen)


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_ids_boundaries_ids_round_trip(name, data):
    n = data.draw(st.integers(1, 80))
    ids = data.draw(st.lists(st.integers(-1, n), min_size=1, max_size=5, unique=True))
    try:
        boundaries = ids_to_boundaries(ids, name, n)
    except LayerIdError:
        return
    back = boundaries_to_ids(boundaries, name, n)
    assert ids_to_boundaries(back, name, n) == boundaries
    conv = get_convention(name)
    if conv.shift_only_if_first_id is None:  # every other convention has one spelling per set
        assert back == (tuple(sorted(ids)) if conv.sorts_ids else tuple(ids))


def test_sglang_deepseek_lowest_boundary_one_needs_a_rotated_list():
    ids = boundaries_to_ids([1, 3], "sglang-deepseek", 8)
    assert ids[0] != 1 and ids_to_boundaries(ids, "sglang-deepseek", 8) == (1, 3)


@pytest.mark.parametrize("call,needle", [
    (lambda: get_convention("tgi"), "unknown convention"),
    (lambda: ids_to_boundaries([], "vllm", 8), "no layer ids"),
    (lambda: ids_to_boundaries([2, 2], "vllm", 8), "more than once"),
    (lambda: ids_to_boundaries([1, 2, 3], "embedding-minus-one", 8), None),  # valid, control
    (lambda: ids_to_boundaries([9], "vllm", 8), "past the last boundary"),
    (lambda: ids_to_boundaries([8], "specforge", 8), "past the last boundary"),
    (lambda: ids_to_boundaries([-1, 3], "specforge", 8), "rejects negative"),
    (lambda: ids_to_boundaries([-2, 3], "embedding-minus-one", 8), "only -1"),
    (lambda: ids_to_boundaries([-1, 3], "vllm", 8), "matches no layer"),
    (lambda: ids_to_boundaries([0, 3], "vllm", 8), "cannot capture boundary 0"),
    (lambda: ids_to_boundaries([-1, 3], "sglang", 8), "rejected"),
    (lambda: ids_to_boundaries([7], "sglang", 8), "cannot capture boundary 8"),
    (lambda: ids_to_boundaries([0, 2], "sglang-deepseek", 8), "cannot capture boundary 0"),
    (lambda: ids_to_boundaries([8], "llamacpp", 8), "final norm"),
    (lambda: boundaries_to_ids([], "vllm", 8), "no layer ids"),
    (lambda: boundaries_to_ids([3, 3], "specforge", 8), "more than once"),
    (lambda: boundaries_to_ids([9], "specforge", 8), "does not exist"),
    (lambda: boundaries_to_ids([0, 4], "specforge", 8), "cannot capture boundary 0"),
    (lambda: boundaries_to_ids([0, 4], "vllm", 8), "no id list fixes this"),
    (lambda: boundaries_to_ids([8], "sglang", 8), "nothing is captured after the last layer"),
    (lambda: boundaries_to_ids([5, 2], "vllm", 8), "ascending"),
    (lambda: boundaries_to_ids([5, 2], "sglang", 8), "ascending"),
    (lambda: boundaries_to_ids([1], "sglang-deepseek", 8), "no id list"),
])
def test_errors_name_problem_and_fix(call, needle):
    if needle is None:
        call()
        return
    with pytest.raises(LayerIdError) as err:
        call()
    message = str(err.value)
    assert needle in message and "\n" not in message
    assert ";" in message  # problem; fix


def test_specforge_keeps_non_ascending_order():
    assert boundaries_to_ids([5, 2], "specforge", 8) == (4, 1)


def test_short_boundary():
    assert short_boundary(0, 8) == "the embedding"
    assert short_boundary(3, 8) == "input of layer 3"
