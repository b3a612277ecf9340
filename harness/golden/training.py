"""Training from nothing: the target on the synthetic language, then EAGLE-3 drafts with the
training-time test (TTT), as SpecForge trains them. Deterministic for a seed on one machine
(fixed thread count, seeded generators, no data-order randomness outside them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.golden.corpus import PAD, Language, sample_batch
from harness.golden.features import aux_features, target_features
from harness.models.draft import DraftConfig, Eagle3Draft
from harness.models.target import DEFAULT_ARCHITECTURE, architecture, build_target, decoder_layers

TTT_STEPS = 7
TTT_DECAY = 0.8


@dataclass
class TargetTraining:
    model: torch.nn.Module
    final_loss: float
    heldout_accuracy: float


def _boundary_hooks(model: torch.nn.Module, store: list[torch.Tensor]) -> list:
    """Record boundaries 1..N (inputs of layers 1..N-1, then the last layer's output) into
    `store` on every forward: the states the decorrelation penalty reads."""
    layers = decoder_layers(model)
    hooks = [layers[k].register_forward_pre_hook(
        lambda mod, args, kwargs: store.append(args[0] if args else kwargs["hidden_states"]),
        with_kwargs=True) for k in range(1, len(layers))]
    hooks.append(layers[-1].register_forward_hook(
        lambda mod, args, out: store.append(out[0] if isinstance(out, tuple) else out)))
    return hooks


def decorrelation_penalty(states: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean over adjacent boundary pairs (k, k+1), k >= 1, of the mean squared cosine between
    the token-centred states: 0 when every layer rewrites the per-token part of the stream.

    Why the golden target trains with it: in a small pre-norm residual stream h_{k+1} = h_k +
    update_k with a small update, so adjacent boundaries are near-parallel (centred cosine
    ~0.98 on a target trained without it) and a draft served one boundary off loses almost
    nothing: acceptance could not tell a wrong wiring (docs/research/bundle_levers.md measures it).
    Centred, because a component constant over tokens is only a bias to fc."""
    total = torch.zeros(())
    for a, b in zip(states[:-1], states[1:], strict=True):
        a = a - a.mean((0, 1), keepdim=True)
        b = b - b.mean((0, 1), keepdim=True)
        total = total + F.cosine_similarity(a, b, dim=-1).pow(2).mean()
    return total / (len(states) - 1)


def penalty_weight(step: int, decorrelate: float, start: int = 0, ramp: int = 0) -> float:
    """The decorrelation penalty's weight at `step`: 0 before `start`, then rising linearly
    to `decorrelate` over `ramp` steps. start = ramp = 0 is the committed recipe (the full
    weight from the first step), and returns exactly `decorrelate`."""
    if step < start:
        return 0.0
    if ramp <= 0:
        return decorrelate
    return decorrelate * min(1.0, (step - start + 1) / ramp)


def train_target_model(model: torch.nn.Module, lang: Language, seed: int, steps: int = 900,
                       batch: int = 32, seq_len: int = 64, lr: float = 3e-3,
                       decorrelate: float = 0.0, decorrelate_start: int = 0,
                       decorrelate_ramp: int = 0) -> tuple[float, float]:
    """Train `model` on the language, plus the decorrelation penalty at `penalty_weight` (a
    training-time term only: the saved target stays a plain model of its architecture, e.g.
    DeepseekV3ForCausalLM, with the same config and keys): (final LM loss, held-out next-token accuracy)."""
    g = torch.Generator().manual_seed(seed + 1)
    device = next(model.parameters()).device  # the CPU for a build; a GPU for benchmarks
    store: list[torch.Tensor] = []
    hooks = _boundary_hooks(model, store) if decorrelate else []
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    losses: list[float] = []
    for step in range(steps):
        x = sample_batch(lang, batch, seq_len, g).to(device)
        store.clear()
        loss = model(input_ids=x, labels=x).loss
        weight = penalty_weight(step, decorrelate, decorrelate_start, decorrelate_ramp)
        total = loss + weight * decorrelation_penalty(store) if weight else loss
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().item())
    for h in hooks:
        h.remove()
    store.clear()
    model.eval()
    held = heldout_batch(lang, seed, seq_len).to(device)
    with torch.no_grad():
        pred = model(input_ids=held).logits[:, :-1].argmax(-1)
    return sum(losses[-20:]) / 20, float((pred == held[:, 1:]).float().mean())


def heldout_batch(lang: Language, seed: int, seq_len: int = 64) -> torch.Tensor:
    """The language samples a target's held-out next-token accuracy is measured on."""
    return sample_batch(lang, 64, seq_len, torch.Generator().manual_seed(seed + 2))


def bigram_accuracy(lang: Language, seed: int, seq_len: int = 64, fit_sequences: int = 2048) -> float:
    """The held-out next-token accuracy of a bigram table (each token's most common successor)
    fitted on `fit_sequences` fresh samples of the language: the best a model of one token of
    context does. The language's hard tokens need more than that (corpus.py), so a target
    that does not beat it has not learned what makes its deep features worth reading."""
    x = sample_batch(lang, fit_sequences, seq_len, torch.Generator().manual_seed(seed + 3))
    counts = torch.zeros(lang.vocab_size, lang.vocab_size)
    counts.index_put_((x[:, :-1].reshape(-1), x[:, 1:].reshape(-1)),
                      torch.ones(x[:, 1:].numel()), accumulate=True)
    held = heldout_batch(lang, seed, seq_len)
    return float((counts.argmax(1)[held[:, :-1]] == held[:, 1:]).float().mean())


def train_target(lang: Language, seed: int, steps: int = 900, decorrelate: float = 0.0,
                 decorrelate_start: int = 0, decorrelate_ramp: int = 0,
                 device: str | torch.device = "cpu", arch: str = DEFAULT_ARCHITECTURE) -> TargetTraining:
    """A target of architecture `arch` (harness.models.target.ARCHITECTURES) trained from its
    seeded initialisation on the language: the same recipe whatever the architecture."""
    model = build_target(architecture(arch).config_dict(lang.vocab_size), seed).to(device)
    loss, acc = train_target_model(model, lang, seed, steps, decorrelate=decorrelate,
                                   decorrelate_start=decorrelate_start,
                                   decorrelate_ramp=decorrelate_ramp)
    return TargetTraining(model, loss, acc)


def is_periodic(row: Sequence[int], max_period: int = 12) -> bool:
    """Whether `row` repeats itself with some period <= `max_period` tokens all the way."""
    return any(all(row[i] == row[i - q] for i in range(q, len(row)))
               for q in range(1, max_period + 1))


@torch.no_grad()
def greedy_loop_fraction(target: torch.nn.Module, lang: Language, seed: int, prompt_len: int,
                         count: int = 64, new_tokens: int = 48, tail: int = 24) -> float:
    """The fraction of the target's greedy continuations of `count` language prompts whose
    last `tail` tokens loop (`is_periodic`, period <= 12 tokens: at most about three words).

    Why the builder measures it: a target whose greedy text loops lets a draft copy its
    answer from the context, without its aux features, so on that text acceptance barely
    moves under a wrong wiring (measured on an AMD EPYC: a target 91% of whose continuations
    loop gave drafts with acc_k 0.95 that lose only 10-20% with every slot one boundary
    early). The language's own samples of this length loop in none of 64 cases; the
    committed target's continuations in 1 of 64."""
    g = torch.Generator().manual_seed(seed + 21)
    with torch.random.fork_rng(devices=[]):  # the build's global RNG stream stays as it was
        rows = regenerate(target, lang, count, prompt_len, prompt_len + new_tokens, g)
    return sum(is_periodic(r[-tail:]) for r in rows[:, prompt_len:].tolist()) / count


@torch.no_grad()
def regenerate(target: torch.nn.Module, lang: Language, count: int, prompt_len: int,
               total_len: int, g: torch.Generator) -> torch.Tensor:
    """Corpus prompts continued by the target's own greedy decoding: the data the draft is
    trained on, as SpecForge's regenerate step recommends, so training accuracy predicts
    greedy serving acceptance."""
    prompts = sample_batch(lang, count, prompt_len, g).to(next(target.parameters()).device)
    out = target.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts),
                          max_new_tokens=total_len - prompt_len, do_sample=False,
                          min_new_tokens=total_len - prompt_len, pad_token_id=PAD)
    return out[:, :total_len].cpu()


def vocab_mapping(data: torch.Tensor, draft_vocab_size: int,
                  vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's frequency-built mapping: the draft vocab holds the most frequent target
    ids in ascending id order; d2t[i] is an OFFSET (target id = i + d2t[i]); t2d a mask."""
    counts = torch.bincount(data.flatten(), minlength=vocab_size)
    top = torch.sort(torch.topk(counts, draft_vocab_size, sorted=True).indices).values
    d2t = top - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[top] = True
    return d2t, t2d


@dataclass
class DraftTraining:
    draft: Eagle3Draft
    acc_k: list[float]  # held-out per-step accuracy, TTT steps 0..6
    final_loss: float


def _features(target: torch.nn.Module, seqs: torch.Tensor,
              boundaries: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 aux features [B, L, n*H] and target argmax labels [B, L] for whole sequences."""
    aux, labels = [], []
    for row in seqs.tolist():
        f = target_features(target, row)
        aux.append(aux_features(f, boundaries))
        assert f.logits is not None, "training features are computed, never read from a bundle"
        labels.append(f.logits.argmax(-1))
    return torch.stack(aux), torch.stack(labels)


def ttt_forward(draft: Eagle3Draft, tokens: torch.Tensor, aux: torch.Tensor,
                labels: torch.Tensor, steps: int = TTT_STEPS, score_from: int = 0,
                first_anchor: int = 0,
                ) -> tuple[torch.Tensor, list[float], list[torch.Tensor]]:
    """The training-time test: step j at position t reads token[t+j+1] and the step-(j-1)
    output (fc(aux) at step 0), sits at rotary position t+j, attends causally to step-0
    keys and to its own diagonal keys of steps 1..j, and predicts the target's argmax at
    t+j+1. This is exactly what a serving engine computes when drafting j+1 tokens ahead.

    Returns the weighted loss, per-step accuracy and per-step draft argmax (draft ids, [B, valid_j]).
    Accuracy counts only predicted tokens at index >= `score_from` (the generated part of a
    regenerated sequence, like SpecForge's response-only loss mask), so acc_k describes the
    greedy continuations that serving acceptance is measured on.

    `first_anchor` > 0 is for scoring only (weight inference reads the blocks of anchors past a
    prompt): after step 0, which every anchor's keys need, only anchors >= first_anchor are
    carried on. A step-j output at anchor t reads step-0 keys at t' <= t and its own diagonal
    keys at t alone, so the anchors kept are computed as with first_anchor = 0 (the same
    operations on fewer rows); the loss, accuracies and step j >= 1's argmax then cover anchors
    first_anchor.. only (preds[j][:, i] is anchor first_anchor + i; step 0 covers every
    anchor). Steps 1..6 on the doctor's 24 + 32-token texts run on 33 rows instead of 56.
    Training leaves it 0, and its operations are then exactly what they were.
    """
    b, length = tokens.shape
    layer = draft.midlayer
    attn = layer.self_attn
    cfg = draft.cfg
    t2d = draft.t2d
    draft_index = torch.cumsum(t2d.long(), 0) - 1  # target id -> draft id where t2d
    hidden = draft.project(aux)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    base = torch.arange(length, device=tokens.device)  # the draft's device (doctor --device)
    causal = base[None, :] <= base[:, None]  # [L, L]
    total = torch.zeros((), device=tokens.device)
    accs: list[float] = []
    preds: list[torch.Tensor] = []
    lo = 0  # the first anchor this step computes (rows lo.. of tokens' positions)
    for j in range(steps):
        valid = length - j - 1  # positions t with a label at t+j+1
        if valid <= 0:
            break
        if j == 1 and first_anchor > 0:
            lo = min(first_anchor, valid)
            hidden = hidden[:, lo:]
        ids = torch.full_like(tokens, PAD)
        ids[:, :valid] = tokens[:, j + 1:j + 1 + valid]
        x = layer.attention_input(draft.embed_tokens(ids[:, lo:]), hidden)
        q, k, v = attn.qkv(x, (base[lo:] + j)[None].expand(b, -1))
        keys.append(attn.query_heads(k))  # repeated once, read by every later step
        values.append(attn.query_heads(v))
        k0, v0 = keys[0], values[0]
        scale = 1.0 / math.sqrt(cfg.head_dim)
        s0 = (q @ k0.transpose(-1, -2)) * scale
        s0 = s0.masked_fill(~causal[lo:], torch.finfo(s0.dtype).min)
        diag_k, diag_v = keys[1:], values[1:]
        sd = [((q * kk).sum(-1) * scale)[..., None] for kk in diag_k]
        probs = torch.cat([s0, *sd], -1).softmax(-1)
        out = probs[..., :length] @ v0
        for i, vv in enumerate(diag_v):
            out = out + probs[..., length + i:length + i + 1] * vv
        out = attn.o_proj(out.transpose(1, 2).reshape(b, length - lo, -1))
        hidden = layer.finish(hidden, out)
        logits = draft.logits(hidden)[:, :max(valid - lo, 0)]
        target = labels[:, j + 1 + lo:j + 1 + valid]
        in_vocab = t2d[target]
        tgt = draft_index[target].clamp(min=0)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none")
        loss = (ce * in_vocab.reshape(-1).float()).mean()
        total = total + (TTT_DECAY ** j) * loss
        pred = logits.argmax(-1)
        preds.append(pred)
        hit = ((pred == tgt) & in_vocab)[:, max(0, score_from - j - 1 - lo):]
        accs.append(float(hit.float().mean()) if hit.numel() else float("nan"))
    return total, accs, preds


def train_draft(target: torch.nn.Module, cfg: DraftConfig, boundaries: Sequence[int],
                train_seqs: torch.Tensor, heldout_seqs: torch.Tensor, d2t: torch.Tensor,
                t2d: torch.Tensor, seed: int, epochs: int = 4, batch: int = 32,
                lr: float = 2e-3, score_from: int = 0) -> DraftTraining:
    torch.manual_seed(seed)
    device = next(target.parameters()).device  # the draft trains where the target runs
    draft = Eagle3Draft(cfg).to(device)
    draft.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    draft.embed_tokens.weight.requires_grad_(False)  # frozen copy, as SpecForge does
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)
    aux, labels = (x.to(device) for x in _features(target, train_seqs, boundaries))
    h_aux, h_labels = (x.to(device) for x in _features(target, heldout_seqs, boundaries))
    train_seqs, heldout_seqs = train_seqs.to(device), heldout_seqs.to(device)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    g = torch.Generator().manual_seed(seed + 7)
    n = train_seqs.shape[0]
    total_steps = epochs * math.ceil(n / batch)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / total_steps)))
    last = float("nan")
    draft.train()
    for _ in range(epochs):
        order = torch.randperm(n, generator=g)
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            loss, _, _ = ttt_forward(draft, train_seqs[idx], aux[idx], labels[idx])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            last = loss.detach().item()
    draft.eval()
    with torch.no_grad():
        _, acc, _ = ttt_forward(draft, heldout_seqs, h_aux, h_labels, score_from=score_from)
    draft.embed_tokens.weight.requires_grad_(True)
    return DraftTraining(draft, acc, last)


def predicted_acceptance_length(acc_k: Sequence[float], num_draft_tokens: int) -> float:
    """tau = 1 + sum_{k<S} prod_{j<=k} acc_j (DESIGN.md): the chain acceptance training implies."""
    tau, running = 1.0, 1.0
    for k in range(min(num_draft_tokens, len(acc_k))):
        running *= acc_k[k]
        tau += running
    return tau

