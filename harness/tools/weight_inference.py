"""Which target boundaries a draft was trained on, inferred from its weights alone.

A draft trained on boundaries B predicts the target's own next tokens best when fc is fed B;
fed other boundaries its accuracy drops by as much as it depends on them. So: compute every
boundary of the target once (fp32 reference, the residual recorder) on prompts continued
greedily by the target itself, then for each candidate combination run the training-time test
(`ttt_forward`, the draft's `TTT_STEPS` steps, one forward per step) and score each anchor
position by the fraction of its steps whose draft argmax is the target's token there: a draft
block, the unit serving accepts. Candidates are ascending combinations of the boundaries 0..N,
as many as fc takes (training writes its slots in ascending boundary order); past
`EXHAUSTIVE_LIMIT` combinations (deep targets) a coordinate search replaces the full search:
each slot in turn takes its best boundary with the others fixed, until a round changes nothing.

Why whole blocks and not step 0 alone: a slot the draft leans on only a little moves step 0
by a few tokens in a hundred, within the sampling error of a few hundred anchors (final-aux's
slot 0, boundary 2 against the embedding: 0.027 ahead against a threshold of 0.039 on 768
anchors of 24 held-out prompts, counted per anchor), but the features a block starts from
steer every later step too, so the block score separates them (0.020 ahead against 0.016,
with the test below). The steps of one block share its features, so a block is scored once
(its steps averaged), never as several observations.

The answer is "ambiguous" unless the best candidate beats the runner-up by more than the
sampling error allows. The two scores are measured on the same anchors, so the evidence is the
paired difference of block scores; but the anchors of one prompt are not independent (they
share its text, and a target's greedy continuation that falls into a loop makes them near
copies), so the unit of the test is the prompt: the standard error is the cluster-robust one
over prompts, and the margin must exceed the two-sided 5% Student t quantile with one degree of
freedom fewer than there are prompts, Bonferroni-corrected over the runner-up comparisons of
the search (the best is picked from many; a noise-level win among 84 candidates is not
evidence). Counted per anchor instead, a random draft came out confidently "trained" on
[6, 7, 8] (0.069 against 0.049, over 8 looping continuations): its margin is real, since any
function of the features ranks them somehow, but it is one of prompts, not of training.

A margin, however clear, is evidence of training only for a draft that has learned something:
so the best candidate must also beat, by the same paired test, the constant guess of the
scored text's most common target token (chosen on the very tokens it is scored on, so an
optimistic bar). Untrained drafts predict 0.01–0.07 of the target's tokens against that
guess's 0.063 (held-out text) and 0.106 (looping greedy continuations of random seeds), and yet
one of ten cleared the cluster-robust margin on held-out text ([1, 4, 7], 0.0085 against
0.0084): without the bar it would be a confident wrong answer.
Nothing here is tuned to a draft: a draft that barely depends on its aux features comes out
"ambiguous", which is the honest answer.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.golden.features import TargetFeatures, aux_features
from harness.golden.training import TTT_STEPS, ttt_forward
from harness.models.draft import Eagle3Draft

EXHAUSTIVE_LIMIT = 5000
BATCH = 32  # prompts of one length per TTT forward (memory grows with it)
ALPHA = 0.05


@dataclass
class Inference:
    """The outcome: the best boundaries, the runner-up, their accuracies, and the verdict."""

    boundaries: list[int]
    accuracy: float
    runner_up: list[int]
    runner_up_accuracy: float
    margin: float  # accuracy(best) - accuracy(runner-up)
    threshold: float  # t quantile * cluster-robust standard error of that paired difference
    tokens: int  # scored anchors (draft blocks)
    steps: int
    prompts: int  # the clusters of the test
    candidates: int
    search: str  # "exhaustive" | "coordinate"
    ambiguous: bool
    # the constant guess (the scored text's most common target token) the best must beat
    baseline_token: int = -1
    baseline_accuracy: float = 0.0
    baseline_threshold: float = 0.0
    informative: bool = True  # the best beats the constant guess beyond the sampling error
    # every candidate the best does not beat beyond the sampling error, the best first: the
    # sets the weights cannot tell apart (one member: the answer is decided)
    plausible: list[list[int]] = field(default_factory=list)
    comparisons: int = 1  # the Bonferroni count of the test: candidates - 1, times the looks
    accuracies: dict[str, float] = field(default_factory=dict, repr=False)

    def line(self) -> str:
        if not self.informative:
            verdict = (f"ambiguous: fed its best boundaries the draft predicts the target's tokens "
                       f"no better than always guessing the most common one, token "
                       f"{self.baseline_token} ({self.baseline_accuracy:.3f}; it must lead that "
                       f"by more than {self.baseline_threshold:.3f}), so how it ranks them is not "
                       f"training's doing (an untrained draft, or text unlike its training data)")
        elif self.ambiguous:
            verdict = ("ambiguous: the margin is within the sampling error, so the weights do not "
                       "say which boundaries training used")
        else:
            verdict = "the weights say training used these boundaries"
        return (f"inferred from the weights: boundaries {self.boundaries} (accuracy "
                f"{self.accuracy:.3f} over {self.tokens} draft blocks of up to {self.steps} steps) "
                f"vs runner-up {self.runner_up} ({self.runner_up_accuracy:.3f}): margin "
                f"{self.margin:+.3f}, threshold {self.threshold:.3f} over {self.prompts} prompts "
                f"({self.search} search over {self.candidates} candidates) — {verdict}")

    def to_json(self) -> dict[str, Any]:
        return {"boundaries": self.boundaries, "accuracy": self.accuracy,
                "runner_up": self.runner_up, "runner_up_accuracy": self.runner_up_accuracy,
                "margin": self.margin, "threshold": self.threshold, "tokens": self.tokens,
                "steps": self.steps, "prompts": self.prompts,
                "candidates": self.candidates, "search": self.search, "ambiguous": self.ambiguous,
                "baseline_token": self.baseline_token, "baseline_accuracy": self.baseline_accuracy,
                "baseline_threshold": self.baseline_threshold, "informative": self.informative,
                "plausible": self.plausible, "comparisons": self.comparisons}


def paired_threshold(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor],
                     comparisons: int = 1) -> tuple[float, float]:
    """(mean of a - b over all anchors, the margin it must exceed): a and b hold per prompt the
    block scores of the same anchors; the standard error is cluster-robust with prompts as
    clusters, times the two-sided ALPHA Student t quantile with (prompts - 1) degrees of
    freedom, Bonferroni-corrected over `comparisons`. One prompt gives no threshold (inf)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    tokens = sum(int(d.numel()) for d in diffs)
    margin = float(torch.cat(diffs).mean()) if tokens else 0.0
    if len(diffs) < 2 or tokens == 0:
        return margin, math.inf
    sums = torch.stack([d.sum() for d in diffs])
    sizes = torch.tensor([float(d.numel()) for d in diffs])
    spread = float(((sums - sizes * margin) ** 2).sum()) * len(diffs) / (len(diffs) - 1)
    quantile = student_t_quantile(1 - ALPHA / (2 * max(1, comparisons)), len(diffs) - 1)
    return margin, quantile * math.sqrt(spread) / tokens


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (p > 0.5) of Student's t with `df` degrees of freedom, by bisection on
    its CDF, 1 - I_{df/(df+t^2)}(df/2, 1/2)/2 (the standard library has the normal only)."""
    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"student_t_quantile needs 0.5 < p < 1 and df >= 1, got {p}, {df}")

    def upper(t: float) -> float:  # P(T > t)
        return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))

    lo, hi = 0.0, 1.0
    while upper(hi) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if upper(mid) > 1.0 - p else (lo, mid)
        if hi - lo < 1e-10 * hi:
            break
    return (lo + hi) / 2.0


def _same_length_batches(seqs: Sequence[Sequence[int]], which: Iterable[int]) -> Iterator[list[int]]:
    """The indices `which` of `seqs`, grouped by sequence length (shortest first) and cut into
    batches of at most `BATCH`: rows of one length need no padding, so a batch computes each
    row as it would alone."""
    which = list(which)
    for length in sorted({len(seqs[i]) for i in which}):
        group = [i for i in which if len(seqs[i]) == length]
        for start in range(0, len(group), BATCH):
            yield group[start:start + BATCH]


def greedy_prompts(target: torch.nn.Module, seeds: Sequence[Sequence[int]],
                   new_tokens: int) -> list[list[int]]:
    """Each seed continued greedily by the target: text the target itself would produce,
    which is what a draft is trained (and served) to predict. Seeds of one length are
    continued side by side, `BATCH` rows per forward (no padding, so each row is computed as
    alone: tests/test_weight_inference.py checks the texts equal one seed at a time); 96
    seeds of 24 tokens continued 32: 31 s against 410 s one at a time on 2 shared cores."""
    out: list[list[int]] = [[] for _ in seeds]
    device = next(target.parameters()).device
    with torch.no_grad():
        for rows in _same_length_batches(seeds, range(len(seeds))):
            ids = torch.tensor([list(seeds[i]) for i in rows], dtype=torch.long, device=device)
            for _ in range(new_tokens):
                nxt = target(input_ids=ids, use_cache=False).logits[:, -1].argmax(-1)
                ids = torch.cat([ids, nxt[:, None]], dim=1)
            for row, i in enumerate(rows):
                out[i] = ids[row].tolist()
    return out


def sampled_prompts(target: torch.nn.Module, count: int, length: int, seed: int,
                    start: int, temperature: float = 1.0) -> list[list[int]]:
    """`count` texts of `length` tokens sampled from the target itself, from token `start`
    (its BOS), the generator seeded with `seed`: text of the target's own distribution, which
    is what a draft is trained to predict (EAGLE-3 drafts are trained on target-generated or
    target-labelled text), and unlike greedy continuations it does not fall into loops whose
    anchors are near copies of each other. Sampled side by side as one batch (no padding:
    every row has the same length)."""
    device = next(target.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((count, 1), int(start), dtype=torch.long, device=device)
    with torch.no_grad():
        for _ in range(length - 1):
            logits = target(input_ids=ids, use_cache=False).logits[:, -1].float().cpu()
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).to(device)
            ids = torch.cat([ids, nxt], dim=1)
    return ids.tolist()


def _hits(draft: Eagle3Draft, prompts: Sequence[Sequence[int]], feats: Sequence[TargetFeatures],
          boundaries: Sequence[int], score_from: int, steps: int) -> list[torch.Tensor]:
    """Per prompt (all of one length, run as one batch: the TTT forward is causal and needs no
    padding), per scored anchor t, the fraction of its TTT steps j (those with a token at
    t+j+1) whose draft argmax is the target's argmax there, inside the draft vocab (module doc)."""
    assert all(f.logits is not None for f in feats), "inference needs the target's logits: compute the features"
    labels = torch.stack([f.logits.argmax(-1) for f in feats])  # features on the CPU
    device = draft.embed_tokens.weight.device
    aux = torch.stack([aux_features(f, boundaries) for f in feats])
    # only the scored anchors are carried past step 0 (ttt_forward's first_anchor): the same
    # argmaxes for them, on 33 rows instead of 56 for the doctor's 24 + 32-token texts
    _, _, preds = ttt_forward(draft, torch.tensor([list(p) for p in prompts], device=device),
                              aux.to(device, draft.embed_tokens.weight.dtype), labels.to(device),
                              steps=steps, first_anchor=max(0, score_from - 1))
    anchors = labels.shape[1] - 1  # those with a label: step 0 covers them all
    return [_block_scores([draft.to_target_ids(pred[row]).cpu()
                           == labels[row, 1 + anchors - pred.shape[1]:1 + anchors]
                           for j, pred in enumerate(preds)], score_from)
            for row in range(len(prompts))]


def _block_scores(step_hits: Sequence[torch.Tensor], score_from: int) -> torch.Tensor:
    """Per scored anchor t, the mean over steps of `step_hits[j][t]`. Step 0's vector covers
    every anchor (0..A-1, those with a next token); step j's ends at anchor A-1-j (the last
    with a token at t+j+1) and may start later than anchor 0 (the scored anchors only)."""
    anchors = step_hits[0].numel()
    hits = torch.zeros(anchors)
    counts = torch.zeros(anchors)
    for j, hit in enumerate(step_hits):
        first = anchors - j - hit.numel()
        hits[first:anchors - j] += hit.float()
        counts[first:anchors - j] += 1
    return (hits / counts)[max(0, score_from - 1):]


def _most_common_label(features: Sequence[TargetFeatures], prompts: Sequence[Sequence[int]],
                       score_from: int) -> int:
    """The target token a constant guess would name: the most common scored label."""
    labels = torch.cat([f.logits.argmax(-1)[max(score_from, 1):len(p)]
                        for p, f in zip(prompts, features, strict=True)])
    return int(torch.bincount(labels).argmax())


def _constant_hits(feats: TargetFeatures, length: int, score_from: int, steps: int,
                   token: int) -> torch.Tensor:
    """`_hits` of a guess that is always `token`: the same anchors, steps and labels."""
    labels = feats.logits.argmax(-1)
    return _block_scores([labels[1 + j:length] == token for j in range(min(steps, length - 1))],
                         score_from)


class BlockScores:
    """Per candidate boundary list (in slot order), per prompt, the block scores of `_hits`.
    Prompts can be added between inferences (the doctor gathers evidence in rounds): each
    (candidate, prompt) pair is scored once, so a later round pays only for its new prompts."""

    def __init__(self, draft: Eagle3Draft, score_from: int = 0, steps: int = TTT_STEPS) -> None:
        self.draft, self.score_from, self.steps = draft, score_from, steps
        self.prompts: list[list[int]] = []
        self.features: list[TargetFeatures] = []
        self._per: dict[tuple[int, ...], list[torch.Tensor]] = {}

    def add(self, prompts: Sequence[Sequence[int]], features: Sequence[TargetFeatures]) -> None:
        if len(prompts) != len(features):
            raise ValueError(f"{len(prompts)} prompts but features for {len(features)}")
        self.prompts += [list(p) for p in prompts]
        self.features += list(features)

    def of(self, boundaries: Sequence[int]) -> list[torch.Tensor]:
        """Per prompt, the block scores of the draft fed `boundaries` in this slot order."""
        have = self._per.setdefault(tuple(int(b) for b in boundaries), [])
        todo = list(range(len(have), len(self.prompts)))
        done: dict[int, torch.Tensor] = {}
        with torch.no_grad():
            for rows in _same_length_batches(self.prompts, todo):
                scored = _hits(self.draft, [self.prompts[i] for i in rows],
                               [self.features[i] for i in rows], tuple(boundaries),
                               self.score_from, self.steps)
                done.update(zip(rows, scored, strict=True))
        have.extend(done[i] for i in todo)
        return have

    def mean(self, boundaries: Sequence[int]) -> float:
        return float(torch.cat(self.of(boundaries)).mean())


def compare(scores: BlockScores, inference: Inference, other: Sequence[int]) -> tuple[float, float]:
    """(mean block score of the inference's best minus `other`'s, the margin it must exceed),
    under the same correction for multiplicity as the inference's own runner-up test: the best
    was picked from the candidates, so a test against it is one of as many comparisons."""
    return paired_threshold(scores.of(inference.boundaries), scores.of(other), inference.comparisons)


def infer_boundaries(draft: Eagle3Draft, prompts: Sequence[Sequence[int]],
                     features: Sequence[TargetFeatures], score_from: int = 0,
                     progress: Callable[[str], None] | None = None,
                     steps: int = TTT_STEPS, scores: BlockScores | None = None,
                     looks: int = 1) -> Inference:
    """Search the target's boundary combinations for the one fc was trained on (module doc).

    `scores`: a BlockScores to reuse (its prompts are then the evidence; `prompts` and
    `features` are ignored), so that rounds of evidence score each prompt once. `looks`: how
    many times, at most, the caller will run this test on growing evidence and stop at the
    first decided answer; the significance level is split over them (Bonferroni), since every
    look is another chance for noise to pass the bar."""
    if scores is None:
        scores = BlockScores(draft, score_from, steps)
        scores.add(prompts, features)
    n = scores.features[0].num_layers
    k = draft.cfg.num_aux
    touched: dict[tuple[int, ...], float] = {}
    total = math.comb(n + 1, k)
    exhaustive = total <= EXHAUSTIVE_LIMIT
    started = time.monotonic()

    def mean(c: tuple[int, ...]) -> float:
        if c not in touched:
            touched[c] = scores.mean(c)
            if progress and len(touched) % 20 == 0:
                spent = time.monotonic() - started
                left = (f", about {spent * (total - len(touched)) / len(touched):.0f} s left"
                        if exhaustive else "")
                progress(f"  {len(touched)}{'/' + str(total) if exhaustive else ''} candidate "
                         f"boundary sets scored on {len(scores.prompts)} prompts "
                         f"({spent:.0f} s{left})")
        return touched[c]

    if exhaustive:
        search = "exhaustive"
        for c in itertools.combinations(range(n + 1), k):
            mean(c)
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
                current = list(max(options, key=mean))
            if current == before:
                break
    ranked = sorted(touched, key=lambda c: touched[c], reverse=True)
    best = ranked[0]
    second = ranked[1] if len(ranked) > 1 else best
    comparisons = max(1, len(touched) - 1) * max(1, looks)
    best_scores = scores.of(best)
    margin, threshold = paired_threshold(best_scores, scores.of(second), comparisons)
    # a margin of zero (no discordant token) is no evidence whatever its standard error
    ambiguous = not (margin > threshold and margin > 0)
    plausible = [list(best)]
    for c in ranked[1:]:
        m, t = paired_threshold(best_scores, scores.of(c), comparisons)
        if not (m > t and m > 0):
            plausible.append(list(c))
    token = _most_common_label(scores.features, scores.prompts, scores.score_from)
    constant = [_constant_hits(f, len(p), scores.score_from, scores.steps, token)
                for p, f in zip(scores.prompts, scores.features, strict=True)]
    lead, needed = paired_threshold(best_scores, constant, max(1, looks))
    informative = lead > needed
    ambiguous = ambiguous or not informative
    return Inference(boundaries=list(best), accuracy=touched[best], runner_up=list(second),
                     runner_up_accuracy=touched[second], margin=margin, threshold=threshold,
                     tokens=int(torch.cat(best_scores).numel()), steps=scores.steps,
                     prompts=len(scores.prompts), candidates=len(touched), search=search,
                     ambiguous=ambiguous, baseline_token=token,
                     baseline_accuracy=float(torch.cat(constant).mean()), baseline_threshold=needed,
                     informative=informative, plausible=plausible, comparisons=comparisons,
                     accuracies={str(list(c)): round(touched[c], 4) for c in ranked})
