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


def layer_id_configs(convention: str, num_layers: int) -> st.SearchStrategy[tuple[int, ...]]:
    """1..4 distinct ids valid under `convention`, in any order the convention accepts,
    drawn through the boundary model so the embedding and final boundary appear whenever
    the convention can express them."""
    from harness.boundaries import LayerIdError, boundaries_to_ids, get_convention

    conv = get_convention(convention)
    capturable = [b for b in range(num_layers + 1) if conv.can_capture(b, num_layers)]

    @st.composite
    def ids(draw: st.DrawFn) -> tuple[int, ...]:
        chosen = draw(st.lists(st.sampled_from(capturable), min_size=1, max_size=min(4, len(capturable)),
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
