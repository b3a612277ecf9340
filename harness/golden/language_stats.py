"""What a token text is in the golden language's terms: its segmentation into lexicon words,
recall markers and junk (`word_parse`), and how closely it follows the language's most likely
successors (`text_stats`). Here, not in a research script, because tests/test_golden_language.py
checks the language with them and no test may import a script (research/language_variants.py
uses them for its figures)."""

from __future__ import annotations

from collections.abc import Sequence

from harness.golden.corpus import RECALL, Language


def word_parse(seq: Sequence[int], lang: Language) -> tuple[list[int | None], list[str], list[int | str]]:
    """Segment a token row (BOS first) into lexicon words, RECALL markers and single junk
    tokens, with as few junk tokens as possible (a last word may be cut). Returns each
    token's unit index (None for BOS), each token's class (first, second, later, marker,
    junk) and the units (word ids, "marker", "junk"). Greedy text is the target's, not the
    language's, so junk must be allowed: it is how far the target is from the lexicon."""
    words = [tuple(w) for w in lang.words]
    n = len(seq)
    inf = n + 1
    cost = [inf] * (n + 1)
    back: list[tuple[int, int, int | str] | None] = [None] * (n + 1)
    cost[1] = 0
    for i in range(1, n):
        if cost[i] == inf:
            continue
        cands: list[tuple[int, int | str, int]] = [(1, "junk", 1)]
        if seq[i] == RECALL:
            cands.append((1, "marker", 0))
        for wi, w in enumerate(words):
            if tuple(seq[i:i + len(w)]) == w[:n - i]:
                cands.append((min(len(w), n - i), wi, 0))
        for length, unit, c in cands:
            if cost[i] + c < cost[i + length]:
                cost[i + length] = cost[i] + c
                back[i + length] = (i, length, unit)
    units: list[tuple[int, int | str]] = []
    k = n
    while k > 1:
        step = back[k]
        assert step is not None
        i, length, unit = step
        units.append((length, unit))
        k = i
    units.reverse()
    index: list[int | None] = [None]
    classes = ["bos"]
    for u, (length, unit) in enumerate(units):
        index += [u] * length
        classes += [unit] if isinstance(unit, str) else (["first", "second"] + ["later"] * 8)[:length]
    return index, classes, [u for _, u in units]


def text_stats(rows: Sequence[Sequence[int]], lang: Language, start: int) -> dict[str, float]:
    """What the tokens from index `start` on of `rows` are, in the language's terms: the share
    of word-to-word transitions (over the parsed word stream, recall copies included) that
    are the language's most likely successor (branch 0, keyed as `lang.lookahead` says), the
    share of junk tokens, and the median number of distinct word pairs among a row's last 24
    transitions (24 = no repetition). The language's own samples score about 0.39 on the
    first (branch 0 has probability 0.6; recall copies break some transitions)."""
    follow = total = junk = tokens = 0
    distinct: list[int] = []
    for row in rows:
        index, classes, units = word_parse(row, lang)
        gen = classes[start:]
        junk += gen.count("junk")
        tokens += len(gen)
        starts = {u: i for i, u in reversed(list(enumerate(index))) if u is not None}
        ws = [(u, starts[k]) for k, u in enumerate(units) if isinstance(u, int)]
        for (before, _), (prev, _), (cur, _), (nxt, at) in zip(ws, ws[1:], ws[2:], ws[3:], strict=False):
            if at >= start:  # a transition inside the scored part
                total += 1
                key = (prev, before) if lang.lookahead else (cur, prev)
                follow += int(lang.successors[key[0], key[1], 0]) == nxt
        tail = [u for u, at in ws if at >= start][-25:]
        distinct.append(len(set(zip(tail, tail[1:], strict=False))))
    return {"follows_table": follow / max(total, 1), "junk_tokens": junk / max(tokens, 1),
            "distinct_pairs_last24_median": sorted(distinct)[len(distinct) // 2]}
