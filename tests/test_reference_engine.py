"""The reference engine: lossless speculative decoding (chain and tree), capture equal to the
training-time features and independent of batch companions, draft rounds equal to training's
TTT, vLLM-style acceptance counters, and the wiring hooks the bug zoo overrides.

A random draft accepts almost nothing, which would leave the accept path (cache crop,
multi-position re-feed, bonus token) untested. So most generation tests use an "echo" pair
built by hand: a target whose greedy next token is a fixed function f of the current token
(large orthonormal embeddings of 48 live tokens, lm_head rows summing them), and a draft that
reads the token from the aux features, steps f once per draft step through its MLP, and ranks
f's value first for most tokens and second for the rest, so rounds accept 0..k tokens and
tree drafting recovers some rejected chains. Both are ordinary checkpoints with set weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engines.base import Acceptance, Capability, EngineOptions
from harness.engines.reference import ReferenceEngine, default_training_convention
from harness.engines.speculative import (
    Round,
    SpecResult,
    _tree_size,
    acceptance_of,
    simulate_chain,
    speculative_generate,
)
from harness.golden.features import aux_features, target_features
from harness.golden.training import ttt_forward
from harness.models.draft import DraftConfig, Eagle3Draft
from harness.models.target import build_target, target_config_dict

H = 128
LIVE = torch.arange(3, 51)  # the echo pair's live tokens
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def _draft_config(ids: tuple[int, ...]) -> DraftConfig:
    return DraftConfig(vocab_size=512, draft_vocab_size=256, hidden_size=H, target_hidden_size=H,
                       aux_layer_ids=ids)


def _restrict_vocab(draft: Eagle3Draft) -> None:
    """Draft vocab = target ids 0..255: d2t offsets all zero, t2d the first half."""
    draft.d2t.zero_()
    draft.t2d.zero_()
    draft.t2d[:256] = True


def random_pair(num_layers: int, ids: tuple[int, ...], seed: int = 0):
    target = build_target(target_config_dict(num_layers=num_layers), seed)
    torch.manual_seed(seed + 1)
    draft = Eagle3Draft(_draft_config(ids))
    _restrict_vocab(draft)
    return target, draft


@torch.no_grad()
def echo_pair(num_layers: int, ids: tuple[int, ...], seed: int = 0, noisy: float = 0.25,
              scale: float = 30.0):
    g = torch.Generator().manual_seed(seed)
    target = build_target(target_config_dict(num_layers=num_layers), seed)
    live = len(LIVE)
    u = torch.linalg.qr(torch.randn(H, live, generator=g))[0].T  # orthonormal rows
    f = torch.randint(0, live, (live,), generator=g)  # f(LIVE[i]) = LIVE[f[i]]
    target.model.embed_tokens.weight[LIVE] = scale * u
    lm = torch.zeros_like(target.lm_head.weight)
    lm.index_add_(0, LIVE[f], u)
    target.lm_head.weight.copy_(lm)

    draft = Eagle3Draft(_draft_config(ids))
    _restrict_vocab(draft)
    draft.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    draft.fc.weight.copy_(torch.cat([torch.eye(H)] * len(ids), 1) / len(ids))  # slot average
    draft.midlayer.self_attn.o_proj.weight.zero_()
    mlp = draft.midlayer.mlp
    for w in (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight):
        w.zero_()
    alpha = 4.0  # unit i fires only on u_i; its output moves u_i to u_f(i)
    fired = torch.nn.functional.silu(torch.tensor(alpha * H ** 0.5)) * H ** 0.5
    mlp.gate_proj.weight[:live] = alpha * u
    mlp.up_proj.weight[:live] = u
    mlp.down_proj.weight[:, :live] = (scale * (u[f] - u) / fired).T
    lmd = torch.zeros_like(draft.lm_head.weight)
    bad = torch.rand(live, generator=g) < noisy
    wrong = LIVE[torch.randint(0, live, (live,), generator=g)]
    for i in range(live):
        if bad[i]:
            lmd[wrong[i]] += u[i]
            lmd[LIVE[f[i]]] += 0.9 * u[i]
        else:
            lmd[LIVE[f[i]]] += u[i]
    draft.lm_head.weight.copy_(lmd)
    return target, draft


def _save(folder: Path, target, draft) -> tuple[Path, Path]:
    target.save_pretrained(str(folder / "target"))
    draft.save(folder / "draft")
    return folder / "target", folder / "draft"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a loaded 2-core box OpenMP
    spinning makes two threads 10-40x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def echo_dirs(tmp_path_factory) -> tuple[Path, Path]:
    return _save(tmp_path_factory.mktemp("echo"), *echo_pair(4, (0, 1, 2)))


@pytest.fixture(scope="module")
def random_dirs(tmp_path_factory) -> tuple[Path, Path]:
    # "-1 = embedding" ids: boundaries 0 (embedding) and 8 = N (before the final norm).
    return _save(tmp_path_factory.mktemp("random"), *random_pair(8, (-1, 3, 7)))


@pytest.fixture(scope="module")
def echo(echo_dirs) -> ReferenceEngine:
    engine = ReferenceEngine(*echo_dirs, EngineOptions(num_draft_tokens=4))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def random_engine(random_dirs) -> ReferenceEngine:
    engine = ReferenceEngine(*random_dirs, EngineOptions(num_draft_tokens=3))
    yield engine
    engine.close()


echo_prompts = st.lists(st.one_of(st.sampled_from(LIVE.tolist()), st.integers(3, 511)),
                        min_size=1, max_size=12)
any_prompts = st.lists(st.integers(3, 511), min_size=1, max_size=16)


# --- losslessness ---------------------------------------------------------------------------

@settings(max_examples=24, **SETTINGS)
@given(prompt=echo_prompts, k=st.sampled_from([1, 2, 4, 6]), new=st.integers(1, 14))
def test_chain_speculative_equals_greedy(echo, prompt, k, new):
    res = echo.speculative(prompt, new, k)
    assert res.tokens == echo.greedy(prompt, new)
    assert len(res.tokens) == new


@settings(max_examples=12, **SETTINGS)
@given(prompt=echo_prompts, k=st.sampled_from([2, 4]), topk=st.sampled_from([2, 3]))
def test_tree_speculative_equals_greedy(echo, prompt, k, topk):
    res = echo.speculative(prompt, 12, k, topk)
    assert res.tokens == echo.greedy(prompt, 12)
    assert all(len(r.beams) == topk and r.num_draft_tokens <= topk * k for r in res.rounds)


@settings(max_examples=10, **SETTINGS)
@given(prompt=any_prompts, topk=st.sampled_from([1, 2]))
def test_random_draft_is_lossless_too(random_engine, prompt, topk):
    res = random_engine.speculative(prompt, 8, 3, topk)
    assert res.tokens == random_engine.greedy(prompt, 8)


def test_echo_pair_exercises_every_accept_count(echo):
    """Guards the fixture: if the echo draft stopped accepting, the tests above would only
    exercise full rejection."""
    prompts = [[int(t)] for t in LIVE[::3]]
    gen = echo.generate(prompts, 16, speculative=True)
    seen = {a for trace in gen.traces for a in trace}
    assert {0, 4} <= seen and seen & {1, 2, 3}
    assert gen.acceptance.mean_acceptance_length > 2.0
    assert gen.tokens == echo.generate(prompts, 16, speculative=False).tokens


# --- draft rounds equal training's TTT ------------------------------------------------------

def _check_rounds_against_ttt(target, draft, boundaries, prompt, res: SpecResult, k: int) -> None:
    """Round at P drafts from position P-1: with its drafted tokens teacher-forced, TTT step j
    at position P-1 must predict the round's j-th draft token."""
    seq = list(prompt) + res.tokens
    for r in res.rounds:
        chain = r.beams[0]
        tokens = seq[:r.position + 1] + chain[:k - 1]
        aux = aux_features(target_features(target, tokens), boundaries)
        ids = torch.tensor([tokens])
        _, _, preds = ttt_forward(draft, ids, aux[None], torch.zeros_like(ids), steps=k)
        expected = [int(draft.to_target_ids(preds[j][0, r.position - 1])) for j in range(k)]
        assert chain == expected, f"round at {r.position}"


@pytest.mark.parametrize("prompt", [[17], [5, 300, 44, 9, 9, 120], list(range(200, 220))])
def test_chain_rounds_reproduce_ttt(random_engine, prompt):
    res = random_engine.speculative(prompt, 10, 3)
    _check_rounds_against_ttt(random_engine.target, random_engine.draft,
                              random_engine.boundaries, prompt, res, 3)


def test_accepting_rounds_reproduce_ttt(echo):
    prompt = [int(LIVE[7]), int(LIVE[20])]
    res = echo.speculative(prompt, 16, 4)
    assert any(r.accepted > 0 for r in res.rounds)
    _check_rounds_against_ttt(echo.target, echo.draft, echo.boundaries, prompt, res, 4)


# --- capture --------------------------------------------------------------------------------

def test_capture_equals_training_features(random_engine):
    assert random_engine.boundaries == (0, 4, 8)
    prompts = [[7], [3, 4, 5, 6, 7, 8], list(range(100, 131))]
    cap = random_engine.capture(prompts)
    for p, feats, fc in zip(prompts, cap.features, cap.fc_out, strict=True):
        expected = aux_features(target_features(random_engine.target, p), (0, 4, 8))
        assert feats.dtype == torch.float32 and feats.shape == (len(p), 3 * H)
        torch.testing.assert_close(feats, expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fc, random_engine.draft.project(expected), rtol=1e-5, atol=1e-5)


@settings(max_examples=15, **SETTINGS)
@given(probe=any_prompts, companions=st.lists(any_prompts, max_size=4),
       position=st.integers(0, 4), side=st.sampled_from(["right", "left"]))
def test_capture_is_batch_invariant(random_engine, probe, companions, position, side):
    alone, alone_fc = random_engine.capture_prompts([probe], side)
    batch = list(companions)
    at = min(position, len(batch))
    batch.insert(at, probe)
    feats, fc = random_engine.capture_prompts(batch, side)
    torch.testing.assert_close(feats[at], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fc[at], alone_fc[0], rtol=1e-5, atol=1e-5)


def test_training_convention_reads_ids(tmp_path):
    assert default_training_convention((1, 3, 4)) == "specforge"
    assert default_training_convention((-1, 3, 5)) == "embedding-minus-one"
    target, draft = random_pair(8, (1, 3, 4))
    t_dir, d_dir = _save(tmp_path, target, draft)
    assert ReferenceEngine(t_dir, d_dir).boundaries == (2, 4, 5)
    original = ReferenceEngine(t_dir, d_dir, EngineOptions(training_convention="eagle3-original"))
    assert original.boundaries == (1, 3, 4)


# --- acceptance -----------------------------------------------------------------------------

def test_acceptance_arithmetic_on_a_hand_trace():
    rounds = [Round(10, [[1, 2, 3, 4]], a, 4) for a in (4, 0, 2, 1)]
    acc = acceptance_of(rounds, 4)
    assert acc == Acceptance(num_drafts=4, num_draft_tokens=16, num_accepted_tokens=7,
                             accepted_per_pos=[3, 2, 1, 1])
    assert acc.mean_acceptance_length == pytest.approx(2.75)  # 11 tokens in 4 verify steps
    assert _tree_size(torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6]])) == 6
    res = SpecResult([0], [Round(3, [[1, 2], [1, 5]], 1, 3)])
    assert res.proposed == [1, 2, 5] and res.trace == [1]


def test_acceptance_counters_are_consistent(echo):
    prompts = [[int(LIVE[i])] for i in range(0, 48, 5)]
    new = 13
    gen = echo.generate(prompts, new, speculative=True)
    acc, k = gen.acceptance, 4
    assert acc.num_drafts == sum(len(t) for t in gen.traces)
    assert acc.num_accepted_tokens == sum(sum(t) for t in gen.traces)
    assert acc.num_draft_tokens == k * acc.num_drafts
    assert acc.accepted_per_pos == [sum(a > i for t in gen.traces for a in t) for i in range(k)]
    assert acc.accepted_per_pos == sorted(acc.accepted_per_pos, reverse=True)
    total = sum(gen.per_prompt_acceptance, Acceptance(accepted_per_pos=[0] * k))
    assert total == acc
    for trace in gen.traces:  # the first token is the prefill's; each round adds a + 1
        produced = 1 + sum(a + 1 for a in trace)
        assert produced >= new and produced - (trace[-1] + 1) < new
    assert [len(p) for p in gen.proposed] == [k * len(t) for t in gen.traces]


def test_functional_api_matches_the_engine(echo):
    prompt = [int(LIVE[3]), 400, int(LIVE[9])]
    tokens, trace = simulate_chain(echo.target, echo.draft, prompt, echo.boundaries, 4, 12)
    res = echo.speculative(prompt, 12, 4)
    assert (tokens, trace) == (res.tokens, res.trace)
    tree = speculative_generate(echo.target, echo.draft, prompt, echo.boundaries, 4, 12, tree_topk=2)
    assert tree[0] == tokens
    assert len(echo.target.model.norm._forward_pre_hooks) == 1  # its hooks were removed


# --- the seam the bug zoo uses --------------------------------------------------------------

class _NoRollback(ReferenceEngine):
    def rollback(self, kv, length):
        pass


class _AbsoluteD2T(ReferenceEngine):
    def map_draft_ids(self, draft_ids):
        return self.draft.d2t[draft_ids] + 7


class _FcEveryStep(ReferenceEngine):
    def draft_step_hidden(self, prev_output):
        return self.project(torch.cat([prev_output] * len(self.boundaries), -1))


class _Sorted(ReferenceEngine):
    def capture_boundaries(self):
        return sorted(super().capture_boundaries(), reverse=True)


class _PostNorm(ReferenceEngine):
    def take_state(self, boundary, states):
        return states.final_normed if boundary == self.num_layers else states.inputs[boundary]


class _NoResidual(ReferenceEngine):
    def take_state(self, boundary, states):
        return states.mlp_out[boundary]


class _Reversed(ReferenceEngine):
    def combine(self, slots):
        return torch.cat(slots[::-1], -1)


class _FcSkipped(ReferenceEngine):
    def project(self, aux):
        return aux[..., :H]


@pytest.mark.parametrize("mutant", [_NoRollback, _AbsoluteD2T, _FcEveryStep])
def test_draft_hooks_change_drafts_not_tokens(random_dirs, random_engine, mutant):
    engine = mutant(*random_dirs, EngineOptions(num_draft_tokens=3))
    prompts = [[11, 12, 13], [250] * 5]
    gen = engine.generate(prompts, 10, speculative=True)
    ref = random_engine.generate(prompts, 10, speculative=True)
    assert gen.tokens == ref.tokens  # speculation stays lossless whatever the draft does
    assert gen.proposed != ref.proposed
    engine.close()


def test_ttt_check_catches_a_missing_rollback(random_dirs):
    """The TTT comparison is what would expose a draft-cache bug, so it must fail on one."""
    engine = _NoRollback(*random_dirs, EngineOptions(num_draft_tokens=3))
    prompt = [5, 300, 44, 9]
    res = engine.speculative(prompt, 8, 3)
    with pytest.raises(AssertionError, match="round at"):
        _check_rounds_against_ttt(engine.target, engine.draft, engine.boundaries, prompt, res, 3)
    engine.close()


@pytest.mark.parametrize("mutant", [_Sorted, _PostNorm, _NoResidual, _Reversed, _FcSkipped])
def test_capture_hooks_change_what_the_draft_sees(random_dirs, random_engine, mutant):
    engine = mutant(*random_dirs, EngineOptions(num_draft_tokens=3))
    prompts = [[11, 12, 13, 14]]
    got, ref = engine.capture(prompts), random_engine.capture(prompts)
    assert not torch.allclose(got.fc_out[0], ref.fc_out[0])
    assert engine.generate(prompts, 6, True).tokens == random_engine.generate(prompts, 6, False).tokens
    engine.close()


def test_engine_protocol(echo):
    assert echo.name == "reference" and echo.convention is None
    assert echo.capabilities == {Capability.CAPTURE, Capability.FC_PROBE, Capability.GENERATE,
                                 Capability.THROUGHPUT, Capability.DECODE_INPUTS}
    assert "transformers" in echo.version()
    assert echo.generate([[5]], 0, True).tokens == [[]]
    assert echo.layer_is_moe(1) and not echo.layer_is_moe(0)


def test_bfloat16_serving_is_lossless(echo_dirs):
    engine = ReferenceEngine(*echo_dirs, EngineOptions(dtype="bfloat16", tree_topk=2))
    prompts = [[int(LIVE[1])], [int(LIVE[30]), int(LIVE[2])]]
    spec = engine.generate(prompts, 10, True)
    assert spec.tokens == engine.generate(prompts, 10, False).tokens
    assert engine.capture(prompts).features[0].dtype == torch.float32
    engine.close()
