"""A synthetic language with structure a tiny target can learn and a draft can predict.

Sentences are chains of multi-token "words" from a fixed lexicon. Words share leading
tokens, so the current word is only known from context, and the next word depends on the
previous two words (the current word and the class of the one before), so a draft that sees only the embedding does
worse than one fed deep target features: wrong aux layers cost acceptance, as in real
models. Token frequencies are Zipf-like so the frequency-built draft vocabulary misses
some real tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BOS, EOS, PAD = 0, 1, 2
FIRST_WORD_TOKEN = 3


@dataclass(frozen=True)
class Language:
    words: list[list[int]]
    successors: torch.Tensor  # [W, 2, branches] next-word ids given (current, class of previous)
    probs: torch.Tensor  # [branches]
    vocab_size: int


def make_language(seed: int, vocab_size: int = 512, num_words: int = 96,
                  branches: int = 3) -> Language:
    g = torch.Generator().manual_seed(seed)
    usable = vocab_size - FIRST_WORD_TOKEN
    # Zipf-like token popularity: low ids (after specials) are common.
    weights = 1.0 / torch.arange(1, usable + 1, dtype=torch.float64) ** 0.7
    words: list[list[int]] = []
    prefixes = torch.multinomial(weights, num_words // 3, replacement=False, generator=g)
    for w in range(num_words):
        length = int(torch.randint(2, 6, (1,), generator=g))
        body = torch.multinomial(weights, length, replacement=True, generator=g) + FIRST_WORD_TOKEN
        body[0] = prefixes[w % len(prefixes)] + FIRST_WORD_TOKEN  # shared first tokens
        words.append(body.tolist())
    successors = torch.randint(0, num_words, (num_words, 2, branches), generator=g)
    probs = torch.tensor([0.8, 0.15, 0.05][:branches], dtype=torch.float64)
    return Language(words, successors, probs / probs.sum(), vocab_size)


def sample_sequence(lang: Language, length: int, g: torch.Generator) -> list[int]:
    """BOS then words until `length` tokens (the last word may be cut)."""
    num_words = len(lang.words)
    prev = int(torch.randint(0, num_words, (1,), generator=g))
    cur = int(torch.randint(0, num_words, (1,), generator=g))
    out = [BOS]
    while len(out) < length:
        out.extend(lang.words[cur])
        branch = int(torch.multinomial(lang.probs, 1, generator=g))
        prev, cur = cur, int(lang.successors[cur, prev % 2, branch])
    return out[:length]


def sample_batch(lang: Language, batch: int, length: int, g: torch.Generator) -> torch.Tensor:
    return torch.tensor([sample_sequence(lang, length, g) for _ in range(batch)], dtype=torch.long)
