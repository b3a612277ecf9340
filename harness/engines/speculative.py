"""EAGLE-3 speculative decoding exactly as training defines it, on an HF transformers target.

This is the judge's own engine: the golden builder simulates acceptance traces with it and
the reference adapter serves with it. It is also the seam the bug zoo cuts into: every
wiring decision a real engine makes (which states it captures, how it concatenates and
projects them, what the draft sees after its first step, how draft ids become target ids,
what happens to the draft cache after a rejection) is one small overridable method of
`Eagle3Runtime`, so a mutant reproduces one real bug by overriding one method.

Decoding state between verify rounds, with P = tokens the target has cached:
- `seq` holds P + 1 tokens; the last one (the previous round's bonus token) is not cached yet;
- the target's DynamicCache holds positions 0..P-1;
- the draft's `DraftKV` holds positions 0..P-1, position t having consumed
  (embed(seq[t+1]), fc(aux_t)) with aux_t the TARGET's features at t.
A round drafts k tokens from the draft output at P-1 (step j >= 1 feeds the draft's own
pre-norm output and its last drafted token at position P-1+j), verifies them in one target
forward on [seq[P], d_1..d_k], keeps the accepted prefix plus the target's bonus token, crops
the target cache, rolls the draft cache back to P and re-feeds the accepted positions with
the target's features, as vLLM's and SGLang's EAGLE-3 workers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import DynamicCache

from harness.engines.base import Acceptance, DraftFeed
from harness.models.draft import DraftKV, Eagle3Draft
from harness.models.residual import StateRecorder, TargetStates
from harness.models.target import decoder_layers


@dataclass
class Round:
    """One verify round: the target had cached `position` tokens; `beams` are the drafted
    root-to-leaf paths in target ids (one for a chain); `accepted` drafted tokens were
    kept, then the bonus token."""

    position: int
    beams: list[list[int]]
    accepted: int
    num_draft_tokens: int


@dataclass
class SpecResult:
    tokens: list[int]
    rounds: list[Round] = field(default_factory=list)

    @property
    def trace(self) -> list[int]:
        return [r.accepted for r in self.rounds]

    @property
    def proposed(self) -> list[int]:
        """Every distinct drafted token (target ids), round by round."""
        out: list[int] = []
        for r in self.rounds:
            seen: set[tuple[int, ...]] = set()
            for beam in r.beams:
                for d in range(len(beam)):
                    if tuple(beam[:d + 1]) not in seen:
                        seen.add(tuple(beam[:d + 1]))
                        out.append(beam[d])
        return out

    def acceptance(self, depth: int) -> Acceptance:
        return acceptance_of(self.rounds, depth)


def acceptance_of(rounds: Sequence[Round], depth: int) -> Acceptance:
    """vLLM's counters: one draft per verify round, its draft tokens (tree nodes for a tree),
    the accepted ones, and per depth how many rounds accepted at least that deep."""
    acc = Acceptance(accepted_per_pos=[0] * depth)
    for r in rounds:
        acc.num_drafts += 1
        acc.num_draft_tokens += r.num_draft_tokens
        acc.num_accepted_tokens += r.accepted
        for i in range(r.accepted):
            acc.accepted_per_pos[i] += 1
    return acc


def _tree_size(beams: torch.Tensor) -> int:
    """Distinct nodes of the tree the beams span (shared prefixes counted once)."""
    rows = beams.tolist()
    return len({tuple(row[:d + 1]) for row in rows for d in range(len(row))})


def _kv_rows(kv: DraftKV, index: torch.Tensor) -> None:
    """Select (and repeat) batch rows of a draft cache: beam reordering for tree drafting."""
    if kv.k is not None:
        kv.k, kv.v, kv.positions = kv.k[index], kv.v[index], kv.positions[index]


class Eagle3Runtime:
    """Target + draft + the wiring between them. Override the hook methods (section below)
    to change one wiring decision; the decoding machinery calls only those for it."""

    def __init__(self, target: torch.nn.Module, draft: Eagle3Draft,
                 boundaries: Sequence[int] | None = None) -> None:
        self.target = target
        self.draft = draft
        self._given_boundaries = tuple(boundaries) if boundaries is not None else None
        self.num_layers = len(decoder_layers(target))
        self.recorder = StateRecorder(target)
        self.device = next(target.parameters()).device
        self.pad_token_id = int(getattr(target.config, "pad_token_id", None) or 0)
        # decode_inputs sets a list here: every draft feed is recorded as fed (None: not recording)
        self.feeds: list[DraftFeed] | None = None

    def close_runtime(self) -> None:
        """Remove the hooks from the target (it may be shared with an oracle)."""
        self.recorder.close()

    @cached_property
    def boundaries(self) -> tuple[int, ...]:
        """The boundaries captured, in slot order; computed once from `capture_boundaries`."""
        return tuple(int(b) for b in self.capture_boundaries())

    def layer_is_moe(self, index: int) -> bool:
        """Whether decoder layer `index` routes to experts (for mutants that treat MoE
        layers differently, as SGLang's two-batch-overlap path does)."""
        return hasattr(decoder_layers(self.target)[index].mlp, "experts")

    # ---------------------------------------------------------------- wiring hooks -------

    def capture_boundaries(self) -> Sequence[int]:
        """Which boundaries fill the draft's aux slots, in slot order.

        Mutants: an engine reading the config ids in its own convention (vLLM: b = id, the
        off-by-one of vLLM #43671; SGLang deepseek: +1 only if the first id is 1; sorted
        slots; default ids when the config's are missing, vLLM #50170)."""
        if self._given_boundaries is None:
            raise ValueError("no boundaries given; pass them or override capture_boundaries()")
        return self._given_boundaries

    def take_state(self, boundary: int, states: TargetStates) -> torch.Tensor:
        """The state an engine puts in a slot for `boundary`, [B, T, H].

        Mutants: boundary N read after the final norm (llama.cpp, `output_hidden_states` in
        transformers 5.19); the residual dropped (`states.mlp_out[boundary]`: an engine that
        keeps hidden and residual apart and captures only hidden); MoE-layer slots zeroed or
        left stale (SGLang's two-batch-overlap path skips capture; see `layer_is_moe`)."""
        return states.inputs[boundary]

    def combine(self, slots: list[torch.Tensor]) -> torch.Tensor:
        """The fc input from the captured slots, [B, T, n*H]: concatenation in slot order.

        Mutants: slots concatenated in ascending boundary order whatever the config's order
        (vLLM/SGLang/TRT-LLM sort ids), or reversed."""
        return torch.cat(slots, dim=-1)

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """The draft's first-step hidden from the fc input: fc (with its trained norms).

        Mutants: fc skipped when the widths happen to match (`if h.shape[-1] != H`, SGLang
        PR #21272: an EAGLE-3 draft run as EAGLE), or its norms ignored."""
        return self.draft.project(aux)

    def draft_step_hidden(self, prev_output: torch.Tensor) -> torch.Tensor:
        """The hidden a draft step j >= 1 receives: the previous step's pre-norm output.

        Mutants: fc applied to this recurrent state too (engines that call the projection on
        every draft step), or the normed output fed back instead."""
        return prev_output

    def map_draft_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocab ids -> target ids: `d2t` holds offsets (target = i + d2t[i]).

        Mutants: d2t read as absolute ids (`d2t[i]`), or the map ignored (i)."""
        return self.draft.to_target_ids(draft_ids)

    def rollback(self, kv: DraftKV, length: int) -> None:
        """After a verify, drop the draft cache entries of the drafted (unverified) steps so
        the accepted positions can be re-fed with the target's features. The next draft
        positions continue from the cache length, so skipping this also shifts positions.

        Mutants: no rollback (stale entries of rejected drafts stay attended and positions
        drift), or a rollback by the wrong count."""
        kv.truncate(length)

    def refeed_features(self, verified: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """The target features re-fed to the draft after a verify, [1, a + 1, F]: the verify
        forward's rows of the accepted positions p..p+a, each at its own position.
        `previous` [1, 1, F] is the last row fed before them (position p - 1).

        Mutants: the rows one late (row t gets the features of t - 1: an engine indexing the
        verify output from the previous round's last position)."""
        return verified

    def draft_positions(self, positions: torch.Tensor, phase: str) -> torch.Tensor:
        """The positions (rotary and causal mask) the draft runs new rows at: row t of the
        sequence at position t, the prefill's rows, the re-fed rows and the drafted steps
        alike (SpecForge trains with the target's position ids). `phase`: "prefill",
        "refeed" (after a verify) or "step" (a drafted step j >= 2).

        Mutants: the drafted steps one position too far (SGLang advanced the positions before
        each draft decode forward instead of after, sgl-project/sglang PR #25015)."""
        return positions

    def draft_cache(self, needed: int) -> DraftKV:
        """The draft cache a new request starts with: an empty one. `needed`: the positions
        this request will use at most.

        Mutants: the previous request's cache handed on uncleared (a slot reused without
        resetting it), so the new request attends to another request's entries."""
        return DraftKV()

    def batch_attention_mask(self, mask: torch.Tensor) -> torch.Tensor | None:
        """The attention mask a padded capture batch runs with, [B, T] (1: a prompt token,
        0: padding): as built, so no request attends to padding.

        Mutants: a mask of ones (every request taken as full width), which a right-padded
        batch survives (padding comes after every prompt token) and a left-padded one does not."""
        return mask

    # ---------------------------------------------------------------- machinery ----------

    def aux_of(self, states: TargetStates) -> torch.Tensor:
        """What the engine hands fc for one forward: [B, T, n*H]; [B, T, 0] where it captures
        no boundary at all (a pipeline stage whose layers hold none of them), which fc refuses
        on the width as a real engine's does."""
        if not self.boundaries:
            return states.inputs[0][..., :0]
        return self.combine([self.take_state(b, states) for b in self.boundaries])

    def target_forward(self, ids: torch.Tensor, positions: torch.Tensor,
                       cache: DynamicCache | None, attention_mask: torch.Tensor | None = None,
                       record: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, T, V] and, when recording, the aux features of these positions."""
        self.recorder.active = record
        try:
            out = self.target(input_ids=ids, position_ids=positions, attention_mask=attention_mask,
                              past_key_values=cache, use_cache=cache is not None)
            aux = self.aux_of(self.recorder.take()) if record else None
        finally:
            self.recorder.active = False
        return out.logits, aux

    def _draft_feed(self, kv: DraftKV, next_tokens: Sequence[int], aux: torch.Tensor,
                    phase: str) -> torch.Tensor:
        """Feed target-verified positions to the draft: position t gets (embed(token[t+1]),
        fc(aux_t)); positions continue from the draft cache length. Returns [1, n, H]. While
        `feeds` is a list (decode_inputs), each feed is recorded there as the draft got it."""
        n = len(next_tokens)
        ids = torch.tensor([list(next_tokens)], dtype=torch.long, device=self.device)
        pos = self.draft_positions(torch.arange(kv.length, kv.length + n, device=self.device)[None],
                                   phase)
        if self.feeds is not None:
            self.feeds.append(DraftFeed([int(x) for x in pos[0]], aux[0].float().cpu()))
        hidden = self.project(aux.to(self.draft.fc.weight.dtype))
        return self.draft.step(ids, hidden, pos, kv)

    def _draft_tokens(self, kv: DraftKV, last: torch.Tensor, k: int, topk: int) -> torch.Tensor:
        """Draft k tokens deep from the draft output `last` [1, 1, H] at position kv.length-1.

        topk = 1 is EAGLE-3's chain. topk > 1 is a beam tree: at each depth every beam
        branches into its top-k draft tokens and the top-k paths by cumulative log-prob
        survive. Returns the beams as target ids [w, k], best first."""
        draft = self.draft
        base = kv.length - 1
        logp = torch.log_softmax(draft.logits(last[:, -1]).float(), -1)  # [1, Vd]
        scores, ids = logp[0].topk(min(topk, logp.shape[-1]))
        beams = self.map_draft_ids(ids)[:, None]
        w = beams.shape[0]
        hidden = last[:, -1:].expand(w, -1, -1)
        if w > 1:
            _kv_rows(kv, torch.zeros(w, dtype=torch.long, device=self.device))
        for depth in range(1, k):
            pos = self.draft_positions(
                torch.full((w, 1), base + depth, dtype=torch.long, device=self.device), "step")
            if self.feeds:
                self.feeds[-1].step_positions.append(int(pos[0, 0]))
            out = draft.step(beams[:, -1:], self.draft_step_hidden(hidden), pos, kv)
            logp = torch.log_softmax(draft.logits(out[:, -1]).float(), -1)  # [w, Vd]
            vd = logp.shape[-1]
            scores, flat = (scores[:, None] + logp).flatten().topk(min(topk, w * vd))
            parent = torch.div(flat, vd, rounding_mode="floor")
            child = self.map_draft_ids(flat % vd)
            beams = torch.cat([beams[parent], child[:, None]], 1)
            hidden = out[parent]
            if topk > 1:
                _kv_rows(kv, parent)
            w = beams.shape[0]
        return beams

    @torch.inference_mode()
    def greedy(self, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
        """Plain greedy decoding with a KV cache: the losslessness baseline."""
        if max_new_tokens <= 0:
            return []
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.target.config)
        logits, _ = self.target_forward(ids, torch.arange(ids.shape[1], device=self.device)[None],
                                        cache, record=False)
        out = [int(logits[0, -1].argmax())]
        while len(out) < max_new_tokens:
            p = ids.shape[1] + len(out) - 1
            logits, _ = self.target_forward(torch.tensor([[out[-1]]], device=self.device),
                                            torch.tensor([[p]], device=self.device), cache,
                                            record=False)
            out.append(int(logits[0, -1].argmax()))
        return out

    @torch.inference_mode()
    def speculative(self, prompt: Sequence[int], max_new_tokens: int, num_draft_tokens: int,
                    tree_topk: int = 1) -> SpecResult:
        """Greedy speculative decoding; lossless: the tokens equal `greedy`'s.

        Every round drafts the full k (vLLM schedules no partial drafts) and is counted even
        where it runs past max_new_tokens; the output is cut to max_new_tokens."""
        if max_new_tokens <= 0:
            return SpecResult([])
        k, topk = int(num_draft_tokens), max(1, int(tree_topk))
        if k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        seq = [int(t) for t in prompt]
        n_prompt = len(seq)
        ids = torch.tensor([seq], dtype=torch.long, device=self.device)
        cache = DynamicCache(config=self.target.config)
        logits, aux = self.target_forward(ids, torch.arange(len(seq), device=self.device)[None], cache)
        seq.append(int(logits[0, -1].argmax()))
        kv = self.draft_cache(n_prompt + max_new_tokens + k + 1)
        last_row = aux[:, -1:]  # the target row of the last fed position (refeed_features)
        last = self._draft_feed(kv, seq[1:], aux, "prefill")[:, -1:]
        result = SpecResult([])
        while len(seq) - n_prompt < max_new_tokens:
            p = len(seq) - 1  # tokens the target has cached
            draft_len = kv.length
            beams = self._draft_tokens(kv, last, k, topk)
            if kv.k is not None and kv.k.shape[0] > 1:
                _kv_rows(kv, torch.zeros(1, dtype=torch.long, device=self.device))
            w = beams.shape[0]
            inp = torch.cat([torch.full((w, 1), seq[-1], dtype=torch.long, device=self.device),
                             beams], 1)
            pos = torch.arange(p, p + k + 1, device=self.device)[None].expand(w, -1)
            if w > 1:
                cache.batch_repeat_interleave(w)
            logits, aux = self.target_forward(inp, pos, cache)
            greedy = logits.argmax(-1)  # [w, k+1]
            matched = (beams == greedy[:, :k]).long().cumprod(1).sum(1)
            best = int(matched.argmax())
            a = int(matched[best])
            if w > 1:
                cache.batch_select_indices(torch.tensor([best], device=self.device))
            cache.crop(-(cache.get_seq_length() - (p + a + 1)))
            emitted = beams[best, :a].tolist() + [int(greedy[best, a])]
            seq.extend(emitted)
            result.rounds.append(Round(p, beams.tolist(), a, _tree_size(beams)))
            self.rollback(kv, draft_len)
            refed = self.refeed_features(aux[best:best + 1, :a + 1], last_row)
            last_row = aux[best:best + 1, a:a + 1]
            last = self._draft_feed(kv, emitted, refed, "refeed")[:, -1:]
        result.tokens = seq[n_prompt:n_prompt + max_new_tokens]
        return result

    @torch.inference_mode()
    def capture_prompts(self, prompts: Sequence[Sequence[int]], padding_side: str = "right",
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One padded batch: per prompt the features handed to fc [T, n*H] and fc's output
        [T, H], both fp32 on the CPU. Padding carries an attention mask and position ids so
        a prompt's features do not depend on its companions."""
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            sl = slice(width - len(p), width) if padding_side == "left" else slice(0, len(p))
            ids[i, sl] = torch.tensor(list(p), dtype=torch.long)
            mask[i, sl] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        _, aux = self.target_forward(ids.to(self.device), positions.to(self.device), None,
                                     attention_mask=self.batch_attention_mask(mask.to(self.device)))
        fc = self.project(aux.to(self.draft.fc.weight.dtype))
        feats, outs = [], []
        for i, n in enumerate(lengths):
            sl = slice(width - n, width) if padding_side == "left" else slice(0, n)
            feats.append(aux[i, sl].float().cpu())
            outs.append(fc[i, sl].float().cpu())
        return feats, outs


def speculative_generate(target: torch.nn.Module, draft: Eagle3Draft, prompt: Sequence[int],
                         boundaries: Sequence[int], num_draft_tokens: int, max_new_tokens: int,
                         tree_topk: int = 1) -> tuple[list[int], list[int]]:
    """Training-faithful greedy speculative decoding of one prompt: (tokens, accepted draft
    tokens per verify round). The golden builder's acceptance simulator."""
    runtime = Eagle3Runtime(target, draft, boundaries)
    try:
        res = runtime.speculative(prompt, max_new_tokens, num_draft_tokens, tree_topk)
    finally:
        runtime.close_runtime()
    return res.tokens, res.trace


def simulate_chain(target: torch.nn.Module, draft: Eagle3Draft, prompt: Sequence[int],
                   boundaries: Sequence[int], num_draft_tokens: int,
                   max_new_tokens: int) -> tuple[list[int], list[int]]:
    """Chain drafting (EAGLE-3's default): what the golden builder's `Simulator` expects."""
    return speculative_generate(target, draft, prompt, boundaries, num_draft_tokens, max_new_tokens)
