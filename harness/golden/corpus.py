"""A synthetic language whose next token, at the hard places, needs what a deep target computes.

Sentences are chains of multi-token "words" from a fixed lexicon, mixed with recall spans:

- word chains: words share leading tokens (three words per first token), and the next word
  depends on the current word AND the previous word (a full second-order table, W x W
  contexts). Inside a word the next token is local (the easy, high-acceptance tokens); at a
  word's start, and at its second token (which of the words sharing the first token it is),
  it needs the identity of the last two words, which only a model that has segmented the
  variable-length words and looked two words back knows. A one-layer draft cannot do that
  over token embeddings (and cannot store a W x W table in its MLP); the target's deep
  features can hand it over.
- recall spans: after every RECALL_EVERY-th word id (a trigger word), the marker RECALL and
  then a copy of the two words before the trigger (induction over a variable-length span:
  where the copy starts is known only once the words are segmented).

With `lookahead` (the committed bundle's, 48 words: `builder.GOLDEN_LANGUAGE`) the next word
depends on the previous word and the one before it instead, so it is fixed before the current
word begins: a target that segments and looks back has it in its deep features at every token
of the current word, a draft that reads those features can predict across the word boundary,
and one fed other layers cannot (docs/research/bundle_levers.md has the measurements).

The first language's successor depended on the current word and the parity of the previous one
(192 contexts): a draft learned the table from the embeddings and predicted ~0.97 of the
target's greedy tokens at every TTT step whatever features it was fed (issue #10).

Token frequencies are Zipf-like so the frequency-built draft vocabulary misses some real
tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

BOS, EOS, PAD = 0, 1, 2
RECALL = 3
FIRST_WORD_TOKEN = 4
RECALL_EVERY = 8  # word ids divisible by this trigger a recall span


@dataclass(frozen=True)
class Language:
    words: list[list[int]]
    successors: torch.Tensor  # [W, W, branches] next-word ids given (current, previous)
    probs: torch.Tensor  # [branches]
    vocab_size: int
    # False (the bundle before issue #10's rebuild): the word after the current one depends on
    # (current, previous). True (the bundle's, `builder.GOLDEN_LANGUAGE`): on (previous, the one
    # before), so the target can plan it before the current word begins, and a draft that
    # reads the target's deep features gets it from them (docs/research/bundle_levers.md measures it)
    lookahead: bool = False
    word_lengths: tuple[int, int] = (2, 5)  # shortest, longest word in tokens, as asked for


def make_language(seed: int, vocab_size: int = 512, num_words: int = 96,
                  branches: int = 3, word_lengths: tuple[int, int] = (2, 5),
                  lookahead: bool = False) -> Language:
    """The language of seed `seed`; `num_words` and `word_lengths` (shortest, longest in
    tokens) are the bundle's by default, other values are for research/language_variants.py."""
    g = torch.Generator().manual_seed(seed)
    usable = vocab_size - FIRST_WORD_TOKEN
    # Zipf-like token popularity: low ids (after specials) are common.
    weights = 1.0 / torch.arange(1, usable + 1, dtype=torch.float64) ** 0.7
    words: list[list[int]] = []
    prefixes = torch.multinomial(weights, num_words // 3, replacement=False, generator=g)
    for w in range(num_words):
        length = int(torch.randint(word_lengths[0], word_lengths[1] + 1, (1,), generator=g))
        body = torch.multinomial(weights, length, replacement=True, generator=g) + FIRST_WORD_TOKEN
        body[0] = prefixes[w % len(prefixes)] + FIRST_WORD_TOKEN  # shared first tokens
        words.append(body.tolist())
    successors = torch.randint(0, num_words, (num_words, num_words, branches), generator=g)
    probs = torch.tensor([0.6, 0.25, 0.15][:branches], dtype=torch.float64)
    return Language(words, successors, probs / probs.sum(), vocab_size, lookahead,
                    (word_lengths[0], word_lengths[1]))


# What a bundle manifest without a "language" record was built on: the language before issue
# #10's rebuild (96 words, the next word keyed on the current and the previous one).
LEGACY_LANGUAGE: dict[str, Any] = {"num_words": 96, "word_lengths": [2, 5], "lookahead": False}


def language_record(lang: Language) -> dict[str, Any]:
    """What a manifest records of `lang` beside its seed, so that every reader of the bundle
    rebuilds the language its target was trained on (`manifest_language`)."""
    return {"num_words": len(lang.words), "word_lengths": list(lang.word_lengths),
            "lookahead": lang.lookahead, "vocab_size": lang.vocab_size,
            "branches": int(lang.probs.numel())}


def manifest_language(manifest: Mapping[str, Any]) -> Language:
    """The language a bundle was built on, from its manifest's seed and "language" record
    (`LEGACY_LANGUAGE` where it has none). Tests and benchmarks that sample prompts like the
    bundle's call this instead of `make_language(seed)`, which would silently give them
    another language than the target learned."""
    spec = {**LEGACY_LANGUAGE, **manifest.get("language", {})}
    return make_language(int(manifest["seed"]), vocab_size=int(spec.get("vocab_size", 512)),
                         num_words=int(spec["num_words"]), branches=int(spec.get("branches", 3)),
                         word_lengths=(int(spec["word_lengths"][0]), int(spec["word_lengths"][1])),
                         lookahead=bool(spec["lookahead"]))


def sample_sequence(lang: Language, length: int, g: torch.Generator) -> list[int]:
    """BOS then words (and recall spans) until `length` tokens (the last may be cut)."""
    num_words = len(lang.words)
    prev = int(torch.randint(0, num_words, (1,), generator=g))
    cur = int(torch.randint(0, num_words, (1,), generator=g))
    before = int(torch.randint(0, num_words, (1,), generator=g)) if lang.lookahead else 0
    out = [BOS]
    history: list[int] = []
    while len(out) < length:
        out.extend(lang.words[cur])
        history.append(cur)
        if cur % RECALL_EVERY == 0 and len(history) >= 3:
            out.append(RECALL)
            out.extend(lang.words[history[-3]] + lang.words[history[-2]])
        branch = int(torch.multinomial(lang.probs, 1, generator=g))
        if lang.lookahead:
            before, prev, cur = prev, cur, int(lang.successors[prev, before, branch])
        else:
            prev, cur = cur, int(lang.successors[cur, prev, branch])
    return out[:length]


def sample_batch(lang: Language, batch: int, length: int, g: torch.Generator) -> torch.Tensor:
    return torch.tensor([sample_sequence(lang, length, g) for _ in range(batch)], dtype=torch.long)
