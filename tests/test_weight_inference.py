"""Weight inference (harness.tools.weight_inference) on the committed target: never a confident wrong
answer. On the bundle's held-out prompts of its own language (24 prompts continued 32 tokens
by the target), every bundle draft's best candidate is its training boundaries, confidently for
specforge-default and single-aux (measured, block scores over 7 TTT steps, prompts as the
test's clusters: margins over the runner-up 0.144 and 0.145, thresholds 0.055 and 0.042) and
within the sampling error for embed-first and final-aux (0.014 against 0.019, 0.013 against
0.031: their runners-up move the last slot by one boundary). With 96 prompts of the language
the error shrinks and embed-first is named confidently (0.014 against 0.008; final-aux 0.011
against 0.010). On untrained drafts (random
weights, the bundle draft's vocab map) it must be "ambiguous" every time, on random-token
seeds and on the held-out text alike — a confident answer there would be noise taken for
evidence. (On random-token seeds continued greedily, what `doctor` used to score without
prompts of the user's own, every answer is "ambiguous"; the doctor now samples text from the
target, `sampled_prompts`, on which tests/test_doctor.py decides the seed case.)
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.golden.features import target_features
from harness.golden.paths import default_bundle_path
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target
from harness.tools.weight_inference import (
    BlockScores,
    greedy_prompts,
    infer_boundaries,
    paired_threshold,
    sampled_prompts,
    student_t_quantile,
)

BUNDLE = default_bundle_path()
SEED_LEN = 8
pytestmark = pytest.mark.slow(reason="scores draft weights over hundreds of generated texts (15-100 s a test on 2 cores)")


@pytest.fixture(scope="module")
def reference():
    target = load_target(BUNDLE / "target")
    gen = torch.Generator().manual_seed(0)
    seeds = [torch.randint(3, 512, (SEED_LEN,), generator=gen).tolist() for _ in range(8)]
    prompts = greedy_prompts(target, seeds, 16)
    return target, prompts, [target_features(target, p) for p in prompts]


def _load(name: str, target) -> Eagle3Draft:
    folder = BUNDLE / f"draft-{name}"
    draft = Eagle3Draft.load(folder)
    if "embed_tokens.weight" not in load_file(str(folder / "model.safetensors")):
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    return draft


HELD_LEN, HELD_NEW = 24, 32


@pytest.mark.parametrize("p, df, expected", [
    # printed tables of Student's t (and, at df = 1, tan(pi * (p - 1/2)))
    (0.975, 1, 12.7062), (0.975, 7, 2.3646), (0.995, 23, 2.8073), (0.975, 1000, 1.9623),
    (0.9, 2, 1.8856),
])
def test_student_t_quantile(p: float, df: int, expected: float) -> None:
    """Meta-test of the test's quantile, which the standard library does not have."""
    assert abs(student_t_quantile(p, df) - expected) < 5e-4


def test_paired_threshold_counts_prompts_not_anchors() -> None:
    """Meta-test of the inference's test: the margin is the mean paired difference over all
    anchors; its standard error is the cluster-robust one over prompts, so a prompt whose
    anchors are copies of each other counts once, and one prompt alone is no evidence."""
    a = [torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0.0, 0.0, 0.0, 0.0])]
    b = [torch.zeros(4), torch.zeros(4)]
    margin, threshold = paired_threshold(a, b)
    # prompt sums 4 and 0 around 8 * 0.5 / 2 = 2 each: spread (4 + 4) * 2/1 = 16, se = 4/8
    assert margin == 0.5 and abs(threshold - student_t_quantile(0.975, 1) * 0.5) < 1e-9
    assert paired_threshold(a[:1], b[:1])[1] == float("inf")
    same = [torch.tensor([0.3, 0.7]), torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])]
    assert paired_threshold(same, same) == (0.0, 0.0)
    # Bonferroni: more comparisons, a higher bar for the same data
    assert paired_threshold(a, b, 83)[1] > threshold


def test_student_t_quantile_refuses_what_it_cannot_answer() -> None:
    with pytest.raises(ValueError, match="0.5 < p < 1"):
        student_t_quantile(0.3, 5)


@pytest.fixture(scope="module")
def in_language():
    target = load_target(BUNDLE / "target")
    held = load_file(str(BUNDLE / "tensors.safetensors"))["heldout.ids"].tolist()
    prompts = greedy_prompts(target, [h[:HELD_LEN] for h in held], HELD_NEW)
    return target, prompts, [target_features(target, p) for p in prompts]


def test_bundle_drafts_inferred_right_or_ambiguous(in_language) -> None:
    target, prompts, feats = in_language
    drafts = json.loads((BUNDLE / "manifest.json").read_text())["drafts"]
    found = {}
    for name, meta in sorted(drafts.items()):
        inf = infer_boundaries(_load(name, target), prompts, feats, score_from=HELD_LEN)
        print(f"{name} (trained {meta['boundaries']}): {inf.line()}")
        assert inf.tokens == len(prompts) * HELD_NEW
        assert inf.ambiguous or inf.boundaries == meta["boundaries"], inf.line()
        assert inf.boundaries == meta["boundaries"], inf.line()  # the best candidate, even if unsure
        found[name] = not inf.ambiguous
    assert found["specforge-default"] and found["single-aux"], found


def test_more_text_of_the_language_names_embed_first_confidently() -> None:
    """The doctor's advice (pass a sample of the draft's training text) on the draft whose 24
    held-out prompts leave it ambiguous: 96 prompts of the manifest's language, continued 32
    tokens, name embed-first's [0, 4, 6] (the embedding) confidently; final-aux right or
    ambiguous, never wrong."""
    from harness.golden.bundle import load_bundle
    from harness.golden.corpus import manifest_language, sample_batch

    manifest = load_bundle(BUNDLE, verify_hashes=False).manifest
    target = load_target(BUNDLE / "target")
    rows = sample_batch(manifest_language(manifest), 96, HELD_LEN,
                        torch.Generator().manual_seed(int(manifest["seed"]) + 51)).tolist()
    prompts = greedy_prompts(target, rows, HELD_NEW)
    feats = [target_features(target, p) for p in prompts]
    for name in ("embed-first", "final-aux"):
        inf = infer_boundaries(_load(name, target), prompts, feats, score_from=HELD_LEN)
        print(f"{name}: {inf.line()}")
        assert inf.ambiguous or inf.boundaries == manifest["drafts"][name]["boundaries"], inf.line()
        if name == "embed-first":
            assert not inf.ambiguous and inf.boundaries == [0, 4, 6], inf.line()


def test_coordinate_search_finds_the_trained_boundaries(in_language, monkeypatch) -> None:
    """The search a deep target gets (past EXHAUSTIVE_LIMIT combinations: 61 layers and 3 slots
    make 37820) forced on the bundle: started from evenly spread boundaries, it must reach each
    3-slot draft's training boundaries, scoring far fewer candidates than the 84, and be as
    sure of them as the exhaustive search is (confident on specforge-default)."""
    import harness.tools.weight_inference as wi

    target, prompts, feats = in_language
    monkeypatch.setattr(wi, "EXHAUSTIVE_LIMIT", 0)
    drafts = json.loads((BUNDLE / "manifest.json").read_text())["drafts"]
    for name in ("specforge-default", "embed-first", "final-aux"):
        inf = infer_boundaries(_load(name, target), prompts, feats, score_from=HELD_LEN)
        print(f"{name} (trained {drafts[name]['boundaries']}): {inf.line()}")
        assert inf.search == "coordinate" and inf.candidates < 84, inf.line()
        assert inf.boundaries == drafts[name]["boundaries"], inf.line()
        assert name != "specforge-default" or not inf.ambiguous, inf.line()


@pytest.mark.parametrize("text", ["random-token seeds", "held-out text"])
def test_untrained_drafts_are_ambiguous(reference, in_language, text: str) -> None:
    target, prompts, feats = reference if text == "random-token seeds" else in_language
    score_from = SEED_LEN if text == "random-token seeds" else HELD_LEN
    base = _load("specforge-default", target)
    lines = []
    for seed in range(10):
        torch.manual_seed(100 + seed)
        draft = Eagle3Draft(base.cfg)
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
        draft.d2t.copy_(base.d2t)
        draft.t2d.copy_(base.t2d)
        inf = infer_boundaries(draft.eval(), prompts, feats, score_from=score_from)
        lines.append(f"random draft {seed} on {text}: {inf.line()}")
    print("\n".join(lines))
    assert all("ambiguous" in line for line in lines), lines


def test_block_scores_batched_and_in_rounds_equal_one_prompt_at_a_time() -> None:
    """The doctor scores prompts of one length as one batch, and adds prompts in rounds: the
    block scores must be exactly those of one prompt at a time (the TTT forward is causal, so
    a batch needs no padding), and an inference over scores grown in two rounds must equal one
    over all prompts at once."""
    target = load_target(BUNDLE / "target")
    prompts = sampled_prompts(target, 6, 20, seed=3, start=0)
    assert len({len(p) for p in prompts}) == 1 and all(p[0] == 0 for p in prompts)
    assert sampled_prompts(target, 6, 20, seed=3, start=0) == prompts  # seeded
    feats = [target_features(target, p) for p in prompts]
    draft = _load("single-aux", target)
    batched = BlockScores(draft, 1)
    batched.add(prompts, feats)
    alone = []
    for p, f in zip(prompts, feats, strict=True):
        one = BlockScores(draft, 1)
        one.add([p], [f])
        alone += one.of((4,))
    assert all(torch.equal(a, b) for a, b in zip(batched.of((4,)), alone, strict=True))
    grown = BlockScores(draft, 1)
    grown.add(prompts[:3], feats[:3])
    infer_boundaries(draft, [], [], scores=grown)
    grown.add(prompts[3:], feats[3:])
    once, twice = infer_boundaries(draft, prompts, feats, score_from=1), infer_boundaries(draft, [], [], scores=grown)
    assert once.to_json() == twice.to_json()


def test_greedy_prompts_side_by_side_equal_one_seed_at_a_time() -> None:
    """Seeds of one length are continued as one batch (no padding): the texts must be those
    of one seed at a time, in the seeds' order, whatever the mix of lengths."""
    target = load_target(BUNDLE / "target")
    seeds = [[0, 5, 9], [0, 7, 11, 13, 2], [0, 3, 4], [0, 8], [0, 5, 9]]
    batched = greedy_prompts(target, seeds, 6)
    alone = []
    with torch.no_grad():
        for s in seeds:
            ids = torch.tensor([s])
            for _ in range(6):
                ids = torch.cat([ids, target(input_ids=ids, use_cache=False).logits[:, -1:].argmax(-1)], 1)
            alone.append(ids[0].tolist())
    assert batched == alone
    assert all(b[:len(s)] == s and len(b) == len(s) + 6 for b, s in zip(batched, seeds, strict=True))


@pytest.mark.parametrize("first_anchor", [1, 23, 40, 54, 60])
def test_scoring_only_the_scored_anchors_leaves_their_argmax_unchanged(in_language, first_anchor: int) -> None:
    """Weight inference carries only the scored anchors past step 0 (ttt_forward's
    first_anchor): for them every step's argmax must be the one the whole forward gives, as
    training runs it (the same operations on fewer rows). Step 0 still covers every anchor; a
    first anchor past the last one with a label leaves the later steps empty, never wrapped
    around to the start; accuracies over anchors all kept are the whole forward's. 23 is the
    doctor's (24-token prompts)."""
    from harness.golden.features import aux_features
    from harness.golden.training import ttt_forward

    target, prompts, feats = in_language
    draft = _load("specforge-default", target).eval()
    tokens = torch.tensor(prompts[:6])
    aux = torch.stack([aux_features(f, (2, 4, 5)) for f in feats[:6]])
    labels = torch.stack([f.logits.argmax(-1) for f in feats[:6]])
    scored = first_anchor + 7  # every step's scored anchors (t >= scored - j - 1) are kept
    with torch.no_grad():
        _, acc_whole, whole = ttt_forward(draft, tokens, aux, labels, score_from=scored)
        _, acc_part, part = ttt_forward(draft, tokens, aux, labels, score_from=scored,
                                        first_anchor=first_anchor)
    assert str(acc_part) == str(acc_whole), "the accuracies read the kept anchors' own labels"
    assert len(part) == len(whole)
    assert torch.equal(part[0], whole[0]), "step 0 must cover every anchor"
    for j in range(1, len(whole)):
        kept = whole[j][:, first_anchor:]
        assert part[j].shape == kept.shape, (j, part[j].shape, kept.shape)
        assert torch.equal(part[j], kept), f"step {j}: {int((part[j] != kept).sum())} argmaxes differ"


@pytest.mark.parametrize("score_from", [1, 24, 50])
def test_block_scores_of_the_scored_anchors_are_those_of_the_whole_forward(in_language, score_from: int) -> None:
    """The block scores weight inference computes on the scored anchors alone must be those of
    the whole forward (score_from 0, every anchor carried through every step) from the first
    scored anchor on: the same hits, steps aligned to the anchors they belong to."""
    from harness.tools.weight_inference import _hits

    target, prompts, feats = in_language
    draft = _load("single-aux", target).eval()
    with torch.no_grad():
        scored = _hits(draft, prompts[:6], feats[:6], (4,), score_from, 7)
        whole = _hits(draft, prompts[:6], feats[:6], (4,), 0, 7)
    for row, (s, w) in enumerate(zip(scored, whole, strict=True)):
        assert torch.equal(s, w[score_from - 1:]), f"prompt {row}: {s.tolist()} != {w[score_from - 1:].tolist()}"
