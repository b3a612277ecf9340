"""Every Hypothesis strategy the suite draws from, in one place (as array-api-tests does).

Prompts are drawn to hit the edges that break engines: length 1, the longest pinned length,
tokens the draft vocabulary does not contain, repeated tokens. Batch shapes cover 1..8
ragged prompts. Layer-id configs cover 1..4 ids per convention, the embedding and the final
boundary included, in unsorted orders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import assume
from hypothesis import strategies as st

from harness.core.boundaries import Convention

SPECIAL_TOKENS = 3  # BOS, EOS, PAD: never inside a drawn prompt body


def prompts(vocab_size: int, corpus: Sequence[Sequence[int]] = (), max_len: int = 32,
            outside_draft_vocab: Sequence[int] = ()) -> st.SearchStrategy[list[int]]:
    """Token-id prompts: corpus-like (a pinned prompt's prefix, possibly with a token swapped
    for one outside the draft vocab) or uniform random ids."""
    random_ids = st.lists(st.integers(SPECIAL_TOKENS, vocab_size - 1), min_size=1, max_size=max_len)
    if not corpus:
        return random_ids

    @st.composite
    def corpus_like(draw: st.DrawFn) -> list[int]:
        base = list(draw(st.sampled_from(list(corpus))))
        n = draw(st.integers(1, len(base)))
        body = base[:n]
        if outside_draft_vocab and draw(st.booleans()):
            i = draw(st.integers(0, len(body) - 1))
            body[i] = draw(st.sampled_from(list(outside_draft_vocab)))
        return body

    return st.one_of(corpus_like(), random_ids)


@dataclass(frozen=True)
class BatchShape:
    """Where a probe prompt sits among companions, and how long everyone is."""

    size: int
    position: int
    companion_lengths: tuple[int, ...]


@st.composite
def batch_shapes(draw: st.DrawFn, max_batch: int = 8, max_len: int = 32) -> BatchShape:
    size = draw(st.integers(1, max_batch))
    position = draw(st.integers(0, size - 1))
    lengths = tuple(draw(st.lists(st.integers(1, max_len), min_size=size - 1, max_size=size - 1)))
    return BatchShape(size, position, lengths)


def layer_id_configs(convention: str | Convention, num_layers: int,
                     max_ids: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """1..max_ids distinct ids valid under `convention` (a name or a Convention), in any order
    the convention accepts, drawn through the boundary model so the embedding and final
    boundary appear whenever the convention can express them. Boundaries are sampled in
    ascending order, so a failure shrinks towards one id naming the lowest boundary."""
    from harness.core.boundaries import LayerIdError, boundaries_to_ids, get_convention

    conv = get_convention(convention)
    capturable = [b for b in range(num_layers + 1) if conv.can_capture(b, num_layers)]

    @st.composite
    def ids(draw: st.DrawFn) -> tuple[int, ...]:
        chosen = draw(st.lists(st.sampled_from(capturable), min_size=1,
                               max_size=min(max_ids, len(capturable)),
                               unique=True))
        if conv.sorts_ids:
            chosen = sorted(chosen)
        try:
            return tuple(boundaries_to_ids(chosen, convention, num_layers))
        except LayerIdError:
            # Some sets no id list expresses (sglang-deepseek cannot reach boundary 1 alone).
            assume(False)
            raise

    return ids()


@st.composite
def invalid_layer_id_configs(draw: st.DrawFn, convention: str | Convention,
                             num_layers: int) -> tuple[int, ...]:
    """Id lists no engine serves as written: a valid list with one id repeated, or with an id
    past the last boundary or below the lowest id the convention knows, inserted anywhere.
    The config lint must reject every one of them."""
    from harness.core.boundaries import get_convention

    conv = get_convention(convention)
    ids = list(draw(layer_id_configs(conv, num_layers, max_ids=3)))
    lowest = conv.embedding_id if conv.embedding_id is not None else 0
    top = num_layers - conv.offset
    bad = draw(st.one_of(st.sampled_from(ids),  # a duplicate
                         st.integers(top + 1, top + 8),  # past the final boundary
                         st.integers(lowest - 8, lowest - 1)))  # below the first id
    at = draw(st.integers(0, len(ids)))
    return tuple(ids[:at] + [bad] + ids[at:])



def pinned_prompt_rows(num_pinned: int, max_size: int = 3) -> st.SearchStrategy[list[int]]:
    """1..max_size distinct rows of the pinned prompt set: for checks that serve a new engine
    per example and capture every pinned prompt at once, so any rows are free to draw."""
    return st.lists(st.integers(0, num_pinned - 1), min_size=1, max_size=max_size, unique=True)
