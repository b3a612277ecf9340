"""Which target boundaries a draft was trained on, inferred from its weights alone.

A draft trained on boundaries B predicts the target's own next tokens best when fc is fed B;
fed other boundaries its accuracy drops by as much as it depends on them. So: compute every
boundary of the target once (fp32 reference, the residual recorder) on prompts continued
greedily by the target itself, then for each candidate combination run one draft forward
(step 0 of the training-time test) and count the positions whose draft argmax is the target's
next token. Candidates are ascending combinations of the boundaries 0..N, as many as fc takes
(training writes its slots in ascending boundary order); past `EXHAUSTIVE_LIMIT` combinations
(deep targets) a coordinate search replaces the full search: each slot in turn takes its best
boundary with the others fixed, until a round changes nothing.

The answer is "ambiguous" unless the best candidate beats the runner-up by more than the
sampling error allows: the two accuracies are measured on the same tokens, so the paired
difference of hits has standard error sd(d)/sqrt(n), and the margin must exceed z times it,
z two-sided at 5% Bonferroni-corrected over the runner-up comparisons of the search (the
best is picked from many; a noise-level win among 84 candidates is not evidence). Nothing here
is tuned to a draft: a draft that barely depends on its aux features comes out "ambiguous",
which is the honest answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch

from harness.golden.features import TargetFeatures, aux_features
from harness.golden.training import ttt_forward
from harness.models.draft import Eagle3Draft

EXHAUSTIVE_LIMIT = 5000
ALPHA = 0.05


@dataclass
class Inference:
    """The outcome: the best boundaries, the runner-up, their accuracies, and the verdict."""

    boundaries: list[int]
    accuracy: float
    runner_up: list[int]
    runner_up_accuracy: float
    margin: float  # accuracy(best) - accuracy(runner-up)
    threshold: float  # z * standard error of that paired difference
    tokens: int
    candidates: int
    search: str  # "exhaustive" | "coordinate"
    ambiguous: bool
    accuracies: dict[str, float] = field(default_factory=dict, repr=False)

    def line(self) -> str:
        verdict = ("ambiguous: the margin is within the sampling error, so the weights do not "
                   "say which boundaries training used" if self.ambiguous
                   else "the weights say training used these boundaries")
        return (f"inferred from the weights: boundaries {self.boundaries} (accuracy "
                f"{self.accuracy:.3f} on {self.tokens} tokens) vs runner-up {self.runner_up} "
                f"({self.runner_up_accuracy:.3f}): margin {self.margin:+.3f}, threshold "
                f"{self.threshold:.3f} ({self.search} search over {self.candidates} candidates) — "
                f"{verdict}")

    def to_json(self) -> dict[str, Any]:
        return {"boundaries": self.boundaries, "accuracy": self.accuracy,
                "runner_up": self.runner_up, "runner_up_accuracy": self.runner_up_accuracy,
                "margin": self.margin, "threshold": self.threshold, "tokens": self.tokens,
                "candidates": self.candidates, "search": self.search, "ambiguous": self.ambiguous}


def greedy_prompts(target: torch.nn.Module, seeds: Sequence[Sequence[int]],
                   new_tokens: int) -> list[list[int]]:
    """Each seed continued greedily by the target: text the target itself would produce,
    which is what a draft is trained (and served) to predict."""
    out = []
    with torch.no_grad():
        for s in seeds:
            ids = torch.tensor([list(s)], dtype=torch.long)
            for _ in range(new_tokens):
                nxt = target(input_ids=ids, use_cache=False).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            out.append(ids[0].tolist())
    return out


def _hits(draft: Eagle3Draft, prompt: Sequence[int], feats: TargetFeatures,
          boundaries: Sequence[int], score_from: int) -> torch.Tensor:
    """Step-0 hits (draft argmax == target's next argmax, inside the draft vocab) per scored token."""
    assert feats.logits is not None, "inference needs the target's logits: compute the features"
    labels = feats.logits.argmax(-1)
    _, _, preds = ttt_forward(draft, torch.tensor([list(prompt)]), aux_features(feats, boundaries)[None],
                              labels[None], steps=1)
    target = labels[1:1 + preds[0].shape[1]]
    hit = draft.to_target_ids(preds[0][0]) == target
    return hit[max(0, score_from - 1):].float()


def infer_boundaries(draft: Eagle3Draft, prompts: Sequence[Sequence[int]],
                     features: Sequence[TargetFeatures], score_from: int = 0,
                     progress: Callable[[str], None] | None = None) -> Inference:
    """Search the target's boundary combinations for the one fc was trained on (module doc)."""
    n = features[0].num_layers
    k = draft.cfg.num_aux
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def hits(c: tuple[int, ...]) -> torch.Tensor:
        if c not in cache:
            with torch.no_grad():
                cache[c] = torch.cat([_hits(draft, p, f, c, score_from)
                                      for p, f in zip(prompts, features, strict=True)])
            if progress and len(cache) % 50 == 0:
                progress(f"  {len(cache)} candidate boundary sets scored")
        return cache[c]

    total = math.comb(n + 1, k)
    if total <= EXHAUSTIVE_LIMIT:
        search = "exhaustive"
        for c in itertools.combinations(range(n + 1), k):
            hits(c)
    else:
        search = "coordinate"
        current = list(sorted({round(i * n / (k + 1)) for i in range(1, k + 1)}))
        while len(current) < k:
            current.append(next(b for b in range(n + 1) if b not in current))
        current.sort()
        for _ in range(4):
            before = list(current)
            for s in range(k):
                options = [tuple(sorted(current[:s] + [b] + current[s + 1:]))
                           for b in range(n + 1) if b not in current[:s] + current[s + 1:]]
                current = list(max(options, key=lambda c: float(hits(c).mean())))
            if current == before:
                break
    ranked = sorted(cache, key=lambda c: float(cache[c].mean()), reverse=True)
    best = ranked[0]
    second = ranked[1] if len(ranked) > 1 else best
    d = cache[best] - cache[second]
    tokens = int(d.numel())
    margin = float(d.mean())
    se = float(d.std(unbiased=True)) / math.sqrt(tokens) if tokens > 1 else math.inf
    comparisons = max(1, len(cache) - 1)
    z = NormalDist().inv_cdf(1 - ALPHA / (2 * comparisons))
    threshold = z * se
    # a margin of zero (no discordant token) is no evidence whatever its standard error
    ambiguous = not (margin > threshold and margin > 0)
    return Inference(boundaries=list(best), accuracy=float(cache[best].mean()), runner_up=list(second),
                     runner_up_accuracy=float(cache[second].mean()), margin=margin, threshold=threshold,
                     tokens=tokens, candidates=len(cache), search=search, ambiguous=ambiguous,
                     accuracies={str(list(c)): round(float(cache[c].mean()), 4) for c in ranked})
