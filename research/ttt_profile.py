"""Why the bundle drafts' accuracy is flat over TTT steps (issue #10 asks for a decaying one).

Teacher-forced TTT accuracy per step (`ttt_forward`, the target's argmax as label) of one
bundle draft on two kinds of text: the target's own greedy continuations of the held-out
prompts (what training's regenerated data, acc_k and served acceptance are measured on), and
fresh samples of the language, split by the class of the token being predicted (a word's
first token, its second, later ones, the RECALL marker, a recall span). Also how many new
tokens merely continue an earlier occurrence of their 3-token context (copyable from the
context by induction), which would make later steps as easy as the first.

    python research/ttt_profile.py --draft specforge-default --out /tmp/ttt_profile.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file

from harness.golden.corpus import BOS, RECALL, RECALL_EVERY, Language, manifest_language
from harness.golden.features import aux_features, target_features
from harness.golden.paths import default_bundle_path
from harness.golden.training import TTT_STEPS, ttt_forward
from harness.models.draft import Eagle3Draft
from harness.models.target import load_target


def classified_sample(lang: Language, length: int, g: torch.Generator) -> tuple[list[int], list[str]]:
    """A language sample with each token's class. Mirrors `corpus.sample_sequence`'s draws so
    the text is the language's; the classes are what that function does not return."""
    num_words = len(lang.words)
    prev = int(torch.randint(0, num_words, (1,), generator=g))
    cur = int(torch.randint(0, num_words, (1,), generator=g))
    out, cls, history = [BOS], ["bos"], []
    while len(out) < length:
        word = lang.words[cur]
        out.extend(word)
        cls.extend(["first", "second"] + ["later"] * (len(word) - 2))
        history.append(cur)
        if cur % RECALL_EVERY == 0 and len(history) >= 3:
            span = lang.words[history[-3]] + lang.words[history[-2]]
            out.extend([RECALL, *span])
            cls.extend(["marker"] + ["recall"] * len(span))
        branch = int(torch.multinomial(lang.probs, 1, generator=g))
        prev, cur = cur, int(lang.successors[cur, prev, branch])
    return out[:length], cls[:length]


def step_hits(draft: Eagle3Draft, target: torch.nn.Module, tokens: Sequence[int],
              boundaries: Sequence[int]) -> list[torch.Tensor]:
    """Per TTT step j, the hits at anchors t (label index t+j+1)."""
    feats = target_features(target, tokens)
    labels = feats.logits.argmax(-1)
    _, _, preds = ttt_forward(draft, torch.tensor([list(tokens)]), aux_features(feats, boundaries)[None],
                              labels[None], steps=TTT_STEPS)
    return [draft.to_target_ids(p[0]) == labels[1 + j:1 + j + p.shape[1]] for j, p in enumerate(preds)]


def copyable(seq: Sequence[int], start: int) -> tuple[int, int]:
    hit = total = 0
    for t in range(max(start, 3), len(seq)):
        key = tuple(seq[t - 3:t])
        hit += any(tuple(seq[i:i + 3]) == key and seq[i + 3] == seq[t] for i in range(t - 3))
        total += 1
    return hit, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", default="specforge-default")
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    bundle = default_bundle_path()
    manifest = json.loads((bundle / "manifest.json").read_text())
    meta = manifest["drafts"][args.draft]
    target = load_target(bundle / "target")
    draft = Eagle3Draft.load(bundle / meta["folder"])
    if "embed_tokens.weight" not in load_file(str(bundle / meta["folder"] / "model.safetensors")):
        draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    held = manifest["heldout"]
    from harness.tools.weight_inference import greedy_prompts

    seeds = load_file(str(bundle / "tensors.safetensors"))["heldout.ids"].tolist()
    greedy = greedy_prompts(target, [s[:held["prompt_len"]] for s in seeds], held["max_new_tokens"])
    acc = [[0, 0] for _ in range(TTT_STEPS)]
    copy = [0, 0]
    with torch.no_grad():
        for seq in greedy:
            for j, h in enumerate(step_hits(draft, target, seq, meta["boundaries"])):
                scored = h[max(0, held["prompt_len"] - 1 - j):]
                acc[j][0] += int(scored.sum())
                acc[j][1] += int(scored.numel())
            a, b = copyable(seq, held["prompt_len"])
            copy[0] += a
            copy[1] += b
        lang = manifest_language(manifest)
        g = torch.Generator().manual_seed(12345)
        by_class: dict[str, list[list[int]]] = {}
        lang_copy = [0, 0]
        for _ in range(args.samples):
            seq, cls = classified_sample(lang, 64, g)
            for j, h in enumerate(step_hits(draft, target, seq, meta["boundaries"])):
                for t in range(16, h.numel()):
                    if t + j + 2 < len(cls):  # label t+j+1 predicts token t+j+2
                        cell = by_class.setdefault(cls[t + j + 2], [[0, 0] for _ in range(TTT_STEPS)])[j]
                        cell[0] += int(h[t])
                        cell[1] += 1
            a, b = copyable(seq, 24)
            lang_copy[0] += a
            lang_copy[1] += b
    result = {
        "draft": args.draft, "boundaries": meta["boundaries"], "manifest_acc_k": meta["acc_k"],
        "greedy_acc_by_step": [round(h / n, 3) for h, n in acc],
        "greedy_copyable": round(copy[0] / copy[1], 3),
        "language_acc_by_step": [round(sum(c[j][0] for c in by_class.values())
                                       / sum(c[j][1] for c in by_class.values()), 3) for j in range(TTT_STEPS)],
        "language_acc_by_class_and_step": {k: [round(h / n, 3) for h, n in v] for k, v in sorted(by_class.items())},
        "language_class_share": {k: round(v[0][1] / sum(c[0][1] for c in by_class.values()), 3)
                                 for k, v in sorted(by_class.items())},
        "language_copyable": round(lang_copy[0] / lang_copy[1], 3),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
