"""The per-architecture seam of the golden target (issue #37): a bundle can be built on a tiny
Qwen3-MoE as well as on the committed DeepSeek-V3, through the same builder. What the harness
needs to know of an architecture is what these tests pin: its router's rule (the envelope marks
routing ties by it, so it must reproduce the router's own choice), and that the one recorder
sees the residual stream of either target at the same boundaries.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness import cli
from harness.golden.builder import BUILD_SIZES, build_bundle, draft_recipes
from harness.golden.bundle import load_bundle
from harness.golden.features import target_features
from harness.golden.paths import default_bundle_path
from harness.models.target import (
    ARCHITECTURES,
    architecture,
    architecture_at,
    build_target,
    decoder_layers,
    load_target,
    moe_routers,
    router_rule,
)
from harness.models.variants import record_routing


def _tiny(arch: str, layers: int = 3) -> torch.nn.Module:
    return build_target(ARCHITECTURES[arch].config_dict(64, layers), seed=5)


def test_cli_offers_exactly_the_architectures() -> None:
    """`golden build --arch` spells the names without importing torch; they must be the
    seam's."""
    assert tuple(ARCHITECTURES) == cli.GOLDEN_ARCHITECTURES


def test_names_and_model_types_resolve() -> None:
    for name, arch in ARCHITECTURES.items():
        assert architecture(name) is arch
        assert architecture(arch.model_type) is arch
    with pytest.raises(ValueError, match="known: deepseek-v3, qwen3-moe"):
        architecture("llama")


def test_committed_target_is_the_deepseek_config() -> None:
    """The DeepSeek branch of the seam still builds the committed target's config: every key
    the builder writes has the value the committed golden/tiny-dsv3 target was saved with."""
    folder = default_bundle_path() / "target"
    saved = json.loads((folder / "config.json").read_text())
    arch = architecture_at(folder)
    assert arch.name == "deepseek-v3"
    want = arch.config_dict(saved["vocab_size"], saved["num_hidden_layers"])
    for key in ("hidden_size", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
                "kv_lora_rank", "qk_rope_head_dim", "first_k_dense_replace", "scoring_func"):
        assert saved[key] == want[key], key
    assert saved["architectures"] == [arch.model_class.__name__]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_router_rule_reproduces_the_routers_choice(arch: str) -> None:
    """The envelope judges routing ties with the rule's scores and margin; a rule that chose
    other experts than the router would mark the wrong tokens. On random hidden states the
    rule's choice is the router's, and its margin is non-negative."""
    model = _tiny(arch)
    routers = moe_routers(model)
    assert routers, f"{arch}: no MoE router found"
    with record_routing(model) as routing:
        model(input_ids=torch.tensor([[3, 9, 17, 4, 33, 5, 21, 8]]))
    assert set(routing.scores) == set(routers)
    for k, gate in routers.items():
        rule = router_rule(gate)
        assert rule is ARCHITECTURES[arch].router
        chosen = rule.choose(routing.scores[k], gate)
        assert torch.equal(chosen.sort(-1).values, routing.chosen[k].sort(-1).values), k
        assert (rule.margin(routing.scores[k], gate) >= 0).all()


def test_qwen3_moe_every_layer_routes() -> None:
    """llama.cpp's qwen3moe graph has no dense layers: the tiny target must not have any."""
    model = _tiny("qwen3-moe", layers=4)
    assert sorted(moe_routers(model)) == [0, 1, 2, 3]


@torch.no_grad()
def test_recorder_sees_qwen3_moe_boundaries() -> None:
    """The one recorder on a Qwen3-MoE: boundary k+1 is layer k's output, boundary N goes
    into the final norm unnormed and `final_normed` is its output, mlp_out[k+1] is layer k's
    MoE output alone."""
    model = _tiny("qwen3-moe")
    outs: list[torch.Tensor] = []
    moe: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, a, o: outs.append(o[0] if isinstance(o, tuple) else o))
             for layer in decoder_layers(model)]
    hooks += [layer.mlp.register_forward_hook(lambda m, a, o: moe.append(o)) for layer in decoder_layers(model)]
    prompt = [5, 7, 11, 13, 2]
    f = target_features(model, prompt)  # the recorder's hooks
    for h in hooks:
        h.remove()
    n = len(decoder_layers(model))
    assert f.boundaries.shape == (n + 1, len(prompt), 128)
    assert torch.equal(f.boundaries[0], model.model.embed_tokens(torch.tensor(prompt)))
    for k in range(n):
        assert torch.equal(f.boundaries[k + 1], outs[k][0]), k
        assert torch.equal(f.mlp_out[k + 1], moe[k][0]), k
    assert torch.equal(f.final_normed, model.model.norm(f.boundaries[n]))


@pytest.mark.slow(reason="builds a qwen3-moe smoke bundle (~15 s)")
def test_qwen3_moe_smoke_build(tmp_path: Path) -> None:
    """The same builder, `arch='qwen3-moe'`: a Qwen3-MoE target saved in its own class, every
    draft recipe, the manifest saying which architecture it is, and pinned boundaries that
    are the loaded target's own; a waived bar is recorded with its verdict."""
    out = build_bundle(tmp_path / "qwen", seed=3, size=BUILD_SIZES["smoke"], log=lambda _: None,
                       arch="qwen3-moe", waive=("decay",))
    bundle = load_bundle(out)
    assert list(bundle.manifest["waived_bars"]) == ["decay"]
    # the way out it names is this architecture's committed target, not the DeepSeek one
    assert "--target-from golden/tiny-qwen3moe/target" in bundle.manifest["waived_bars"]["decay"]
    assert bundle.manifest["target"]["architecture"] == "Qwen3MoeForCausalLM"
    assert "Qwen3-MoE" in bundle.manifest["description"]
    assert set(bundle.draft_names) == {r.name for r in draft_recipes(bundle.num_layers)}
    target = load_target(bundle.target_dir)
    assert type(target).__name__ == "Qwen3MoeForCausalLM"
    for i, prompt in enumerate(bundle.prompts()):
        pinned = bundle.tensors["boundaries"][i][:, : len(prompt)]  # [N+1, T, H]
        assert torch.equal(pinned, target_features(target, prompt).boundaries), i


def test_unknown_or_mismatched_architecture_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no golden target architecture 'llama'"):
        build_bundle(tmp_path / "x", size=BUILD_SIZES["smoke"], log=lambda _: None, arch="llama")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="--waive canary: not a waivable bar"):
        build_bundle(tmp_path / "x", size=BUILD_SIZES["smoke"], log=lambda _: None, waive=("canary",))
    committed = default_bundle_path() / "target"
    seed = json.loads((committed / "training.json").read_text())["seed"]
    full = BUILD_SIZES["full"]
    with pytest.raises(ValueError, match="holds a deepseek_v3 target, not the qwen3-moe"):
        build_bundle(tmp_path / "y", seed=seed, size=full, log=lambda _: None,
                     target_from=committed, arch="qwen3-moe")


def test_committed_qwen3_moe_bundle_is_pinned_and_checked_like_the_default() -> None:
    """golden/tiny-qwen3moe sits beside the default bundle with its own pin: a run on it checks
    the pin (is_committed), and the committed manifest is the pinned one."""
    import hashlib

    from harness.golden.pins import PINNED_MANIFESTS
    from harness.run.bundle_gate import committed_pin_problem, is_committed, is_pinned

    folder = default_bundle_path().parent / "tiny-qwen3moe"
    bundle = load_bundle(folder)
    assert hashlib.sha256((folder / "manifest.json").read_bytes()).hexdigest() == PINNED_MANIFESTS["tiny-qwen3moe"]
    assert is_committed(bundle) and is_pinned(bundle) and committed_pin_problem(bundle) is None
    assert architecture_at(bundle.target_dir).name == "qwen3-moe"
    assert bundle.manifest["target"]["architecture"] == "Qwen3MoeForCausalLM"
    # built with the two acceptance bars waived, and the manifest says why they were not met
    assert sorted(bundle.manifest["waived_bars"]) == ["decay", "shift"]
    assert all("golden/tiny-qwen3moe/target" in why and "tiny-dsv3" not in why
               for why in bundle.manifest["waived_bars"].values())


def test_an_engine_run_on_the_qwen3_moe_bundle_reads_its_own_xfails() -> None:
    """Known nonconformances are per engine and bundle: llama.cpp's list on tiny-dsv3 marks
    every draft engine_cannot_express (deepseek2 records no layer input), which on
    tiny-qwen3moe would strictly fail the specforge-default checks that pass there. The
    qwen3-moe run reads llamacpp@tiny-qwen3moe.txt; any other bundle the engine's own list."""
    from harness.golden.paths import suites_path
    from harness.run.xfails import default_xfails_path, read_xfails

    folder = suites_path() / "xfails"
    own = default_xfails_path(folder, "llamacpp", "tiny-qwen3moe")
    assert own.name == "llamacpp@tiny-qwen3moe.txt"
    assert default_xfails_path(folder, "llamacpp", "tiny-dsv3").name == "llamacpp.txt"
    # vLLM's run there has its own list too (its b = id reading and sort, measured on the bundle)
    assert default_xfails_path(folder, "vllm", "tiny-qwen3moe").name == "vllm@tiny-qwen3moe.txt"
    assert default_xfails_path(folder, "vllm", "some-other-bundle").name == "vllm.txt"
    rules = read_xfails(own)
    assert rules and not any("specforge-default" in r.pattern for r in rules)
    kinds = {r.reason.split("]")[0].lstrip("[") for r in rules}
    assert kinds == {"ids_ignored", "engine_cannot_express"}, kinds


def test_every_architecture_names_its_committed_bundle() -> None:
    """The bundle a refused build is told to start from (`rebuild_hint`) is a pinned, committed
    bundle of that very architecture."""
    import json

    from harness.golden.builder import rebuild_hint
    from harness.golden.paths import committed_bundle_path
    from harness.golden.pins import PINNED_MANIFESTS
    from harness.models.target import ARCHITECTURES

    for arch in ARCHITECTURES.values():
        assert arch.bundle in PINNED_MANIFESTS, arch.name
        manifest = json.loads((committed_bundle_path(arch.bundle) / "manifest.json").read_text())
        assert manifest["target"]["architecture"] == arch.model_class.__name__, arch.name
        assert f"--target-from golden/{arch.bundle}/target" in rebuild_hint(arch.name)
