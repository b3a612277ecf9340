"""The golden language: the bundle's stays the one it was built on, the variants that
research/language_variants.py measures mean what they say, and the word parse that measures
a target's greedy text counts what it claims (issue #10)."""

from __future__ import annotations

import dataclasses

import torch
from safetensors.torch import load_file

from harness.golden.builder import GOLDEN_LANGUAGE, _pinned_prompts, golden_language
from harness.golden.bundle import load_bundle
from harness.golden.corpus import (
    RECALL,
    language_record,
    make_language,
    manifest_language,
    sample_batch,
)
from harness.golden.language_stats import text_stats, word_parse
from harness.golden.paths import default_bundle_path


def _deterministic(lang):
    """The language with its most likely successor always taken (branch 0)."""
    return dataclasses.replace(lang, probs=torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))


def test_bundle_language_is_the_one_the_bundle_was_built_on() -> None:
    """The language the manifest records regenerates the committed bundle's pinned prompts
    exactly, and it is the builder's: a reader that samples prompts like the bundle's
    (`manifest_language`) gets the language the target learned, and a changed
    `GOLDEN_LANGUAGE` or `make_language` would fail here before it silently made a rebuild
    differ. The first language (96 words, no lookahead) gives other prompts, so the check
    can fail."""
    bundle = load_bundle(default_bundle_path(), verify_hashes=False)
    tensors = load_file(str(bundle.path / "tensors.safetensors"))
    lengths = tensors["prompts.lengths"].tolist()
    seed = int(bundle.manifest["seed"])
    assert bundle.manifest["language"] == language_record(golden_language(seed))
    assert {k: bundle.manifest["language"][k] for k in GOLDEN_LANGUAGE} == {
        k: list(v) if isinstance(v, tuple) else v for k, v in GOLDEN_LANGUAGE.items()}
    pinned = _pinned_prompts(manifest_language(bundle.manifest), seed, len(lengths))
    assert [len(p) for p in pinned] == lengths
    for row, prompt in zip(tensors["prompts.ids"].tolist(), pinned, strict=True):
        assert row[:len(prompt)] == prompt
    legacy = _pinned_prompts(make_language(seed), seed, len(lengths))
    assert any(row[:len(p)] != p for row, p in zip(tensors["prompts.ids"].tolist(), legacy, strict=True))


def test_word_parse_on_language_samples_and_on_junk() -> None:
    """The language's own samples parse into lexicon words with no junk, their classes follow
    the words' lengths; one foreign token inserted is exactly one junk token."""
    lang = make_language(0)
    rows = sample_batch(lang, 16, 120, torch.Generator().manual_seed(4)).tolist()
    for row in rows:
        index, classes, units = word_parse(row, lang)
        assert "junk" not in classes and len(classes) == len(row) and index[0] is None
        for u, unit in enumerate(units[:-1]):  # the last word may be cut
            span = [c for c, i in zip(classes, index, strict=True) if i == u]
            if isinstance(unit, int):
                assert len(span) == len(lang.words[unit])
                assert span[:2] == ["first", "second"] and set(span[2:]) <= {"later"}
            else:
                assert unit == "marker" and span == ["marker"]
    used = {t for w in lang.words for t in w} | {RECALL}
    foreign = next(t for t in range(4, lang.vocab_size) if t not in used)
    index = word_parse(rows[0], lang)[0]
    at = index.index(5)  # where the sixth unit begins: between two words
    row = rows[0][:at] + [foreign] + rows[0][at:]
    _, classes, _ = word_parse(row, lang)
    assert classes.count("junk") == 1 and classes[at] == "junk"


def test_follows_table_tells_the_keying_apart() -> None:
    """With the most likely successor always taken, the measure finds the language's own rule
    on most transitions and the other keying's on few. The floor 0.5: each recall span (after
    one word in 8) copies two words into the word stream, which breaks at most the five 4-word
    windows around it, so at most 5/8 / (1 + 2/8) = half of the windows are broken."""
    for lookahead in (False, True):
        lang = _deterministic(make_language(0, lookahead=lookahead))
        rows = sample_batch(lang, 32, 200, torch.Generator().manual_seed(4)).tolist()
        right = text_stats(rows, lang, 0)
        wrong = text_stats(rows, dataclasses.replace(lang, lookahead=not lookahead), 0)
        assert right["junk_tokens"] == 0
        assert right["follows_table"] > 0.5, (lookahead, right)
        assert right["follows_table"] > 3 * wrong["follows_table"], (lookahead, right, wrong)


def _clashes(lang, rows, offset: int) -> tuple[int, int]:
    """How often two places with the same pair of words `offset`+1 and `offset` before a word
    are followed by different words (skipping recall copies), and how many places there were."""
    seen: dict[tuple[int, int], int] = {}
    clashes = total = 0
    for row in rows:
        units = word_parse(row, lang)[2][:-1]  # the last word may be cut: which one is ambiguous
        words: list[int] = []
        copied: set[int] = set()  # word positions inside recall copies
        for unit in units:
            if unit == "marker":
                copied |= {len(words), len(words) + 1}
            elif isinstance(unit, int):
                words.append(unit)
        for i in range(offset + 1, len(words)):
            if set(range(i - offset - 1, i + 1)) & copied:
                continue
            key = (words[i - offset - 1], words[i - offset])
            total += 1
            clashes += seen.setdefault(key, words[i]) != words[i]
    return clashes, total


def test_lookahead_fixes_the_next_word_a_word_ahead() -> None:
    """With the successor always branch 0, the bundle's language makes a word a function of the
    two words just before it; the lookahead language, of the two before those (so it is fixed
    before the word preceding it begins), and not of the two just before it."""
    for lookahead, offset in ((False, 1), (True, 2)):
        lang = _deterministic(make_language(0, lookahead=lookahead))
        rows = sample_batch(lang, 64, 120, torch.Generator().manual_seed(9)).tolist()
        clashes, total = _clashes(lang, rows, offset)
        assert total > 200 and clashes == 0, (lookahead, clashes, total)
    lang = _deterministic(make_language(0, lookahead=True))
    rows = sample_batch(lang, 64, 120, torch.Generator().manual_seed(9)).tolist()
    clashes, total = _clashes(lang, rows, 1)
    assert clashes > 0.05 * total, (clashes, total)
