"""The harness's SGLang conventions against SGLang's own code, executed from each installed
release (how, and why not by importing it: tests/sglang_source.py).

What runs is SGLang's: `set_eagle3_layers_to_capture` of llama.py's LlamaForCausalLM and
deepseek_v2.py's DeepseekV2ForCausalLM on a stand-in `self` (pp_group, config, model: the
attributes it reads), and the model runner's try/except that reads the draft's layer ids,
on the draft's config loaded by real transformers (as SGLang's ModelConfig does). The
expected rule is `convention_for(architecture, version)`, the adapter's own choice, so
each release is held to the convention the adapter would declare for it; a release whose
rule differs from that convention fails here (test_a_wrong_convention_is_caught shows it
with the rule before PR #25454).

What is read but not executed: how the forward turns `layers_to_capture` into captured
states (ascending, once each, b=N never). `capture_adds_residual` checks the one part that
changed across releases (hidden+residual before the layer, which fails at layer 0, versus
the layer-boundary stage, which captures the embedding there) against the convention.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import transformers
from sglang_source import (
    INSTALL_HINT,
    REPO_ROOT,
    capture_adds_residual,
    id_reader,
    installed_function,
    installed_roots,
    release_params,
    run_block,
    version_of,
)

from harness.core.boundaries import Convention, LayerIdError, get_convention, ids_to_boundaries
from harness.engines.sglang import SglangEngine, convention_for, release

ROOTS = installed_roots()
BUNDLE = REPO_ROOT / "golden" / "tiny-dsv3"
N = 8  # the bundle target's layers
# (file, class whose set_eagle3_layers_to_capture runs, the decoder model class, an arch)
MODELS = {
    "llama": ("sglang/srt/models/llama.py", "LlamaForCausalLM", "LlamaModel", "LlamaForCausalLM"),
    "deepseek_v2": ("sglang/srt/models/deepseek_v2.py", "DeepseekV2ForCausalLM",
                    "DeepseekV2Model", "DeepseekV3ForCausalLM"),
}
# Every ordered id list of length 1..3 over -2..N: negatives, duplicates, b=0, b=N, orders.
ID_LISTS = [list(c) for r in (1, 2, 3) for c in itertools.product(range(-2, N + 1), repeat=r)]


@pytest.fixture(params=release_params())
def root(request: pytest.FixtureRequest) -> Path:
    return request.param


def layers_to_capture(root: Path, model: str, ids: list[int] | None, num_layers: int = N,
                      last_rank: bool = True) -> list[int] | None:
    """SGLang's set_eagle3_layers_to_capture, executed; None where it set nothing."""
    module, cls, _, _ = MODELS[model]
    fn = installed_function(root, module, cls, "set_eagle3_layers_to_capture")
    stand_in = SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=last_rank),
                               config=SimpleNamespace(num_hidden_layers=num_layers),
                               model=SimpleNamespace(), capture_aux_hidden_states=False)
    fn(stand_in, None if ids is None else list(ids))
    return getattr(stand_in.model, "layers_to_capture", None)


def engine_outcome(layers: list[int], slots: int, conv: Convention) -> tuple[int, ...] | str:
    """What SGLang's capture loop (`for i in range(N): ... if i in layers_to_capture`) makes of
    the executed list: the boundaries it fills, ascending and once each, or why it breaks."""
    captured = sorted({v for v in layers if 0 <= v < N})
    if 0 in captured and not conv.capture_embedding:
        return "crash before layer 0"
    if len(captured) < slots:
        return "slot dropped"
    if len(captured) > slots:
        return f"{len(captured)} slots for {slots}"
    return tuple(captured)


def disagreements(root: Path, model: str, conv: Convention) -> list[str]:
    out = []
    for ids in ID_LISTS:
        engine = engine_outcome(layers_to_capture(root, model, ids), len(ids), conv)
        try:
            harness: tuple[int, ...] | str = ids_to_boundaries(ids, conv, N)
        except LayerIdError:
            harness = "rejected"
        if harness == "rejected":
            # the harness refuses every negative id by design (none is a portable layer id)
            if isinstance(engine, tuple) and min(ids) >= 0 and conv.embedding_id not in ids:
                out.append(f"ids {ids}: SGLang captures {engine}, {conv.name} rejects them")
        elif harness != engine:
            out.append(f"ids {ids}: SGLang -> {engine}, {conv.name} -> {harness}")
    default = layers_to_capture(root, model, None)
    if tuple(default) != conv.default_boundaries(N):
        out.append(f"no ids: SGLang -> {default}, {conv.name} -> {conv.default_boundaries(N)}")
    return out


def _expected(root: Path, model: str) -> Convention:
    return get_convention(convention_for(MODELS[model][3], version_of(root)))


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_convention_predicts_sglangs_executed_rule(root: Path, model: str) -> None:
    conv = _expected(root, model)
    problems = disagreements(root, model, conv)
    assert not problems, f"{version_of(root)} {model} vs {conv.name}: " + "; ".join(problems[:5])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_capture_style_matches_the_convention(root: Path, model: str) -> None:
    module, _, decoder, _ = MODELS[model]
    conv = _expected(root, model)
    adds_residual = capture_adds_residual(root, module, decoder)
    assert adds_residual == (not conv.capture_embedding), (
        f"{version_of(root)} {decoder}.forward {'adds' if adds_residual else 'does not add'} "
        f"hidden+residual before the layer, but {conv.name} says boundary 0 is "
        f"{'' if conv.capture_embedding else 'not '}capturable")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_capture_is_skipped_on_pipeline_ranks_but_the_last(root: Path, model: str) -> None:
    assert layers_to_capture(root, model, [1, 3, 4], last_rank=False) is None
    assert layers_to_capture(root, model, [1, 3, 4]) is not None


def _draft_config(tmp_path: Path, fmt: str) -> transformers.PretrainedConfig:
    """The bundle's SpecForge draft config in one of the two layouts in the wild."""
    config = json.loads((BUNDLE / "draft-specforge-default" / "config.json").read_text())
    ids = config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
    if fmt == "nested":
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    else:  # speculators: the ids at the top level
        config["eagle_aux_hidden_state_layer_ids"] = ids
    (tmp_path / "config.json").write_text(json.dumps(config))
    return transformers.AutoConfig.from_pretrained(tmp_path)


def read_layer_ids(root: Path, hf_config: transformers.PretrainedConfig) -> Any:
    """The model runner's own try/except, executed on the loaded draft config."""
    path, block = id_reader(root)
    holder = SimpleNamespace()
    # the block assigns into `self` (model_runner.py) or `config` (spec_aux_hidden_state.py)
    run_block(path, block, {"draft_model_config": SimpleNamespace(hf_config=hf_config),
                            "self": holder, "config": holder})
    return holder.eagle_aux_hidden_state_layer_ids


def observed(root: Path, tmp_path: Path, fmt: str) -> tuple[Any, list[int]]:
    """(ids the runner reads, layers_to_capture on the bundle's DeepSeek target)."""
    folder = tmp_path / fmt
    folder.mkdir()
    ids = read_layer_ids(root, _draft_config(folder, fmt))
    return ids, layers_to_capture(root, "deepseek_v2", ids)


def test_only_the_nested_ids_are_read(root: Path, tmp_path: Path) -> None:
    """Nested ids are used; top-level (speculators) ids are dropped by the bare except and
    the defaults captured instead, whatever the draft was trained on."""
    trained = json.loads((BUNDLE / "draft-specforge-default" / "config.json").read_text())[
        "eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    nested_ids, _ = observed(root, tmp_path, "nested")
    top_ids, top_layers = observed(root, tmp_path, "top-level")
    assert nested_ids == trained
    assert top_ids is None
    assert tuple(top_layers) == _expected(root, "deepseek_v2").default_boundaries(N)


def test_a_wrong_convention_is_caught() -> None:
    """The deepseek rule changed in 0.5.13 (PR #25454). The newest convention held against a
    release from before it, and the old rule against a release after it, must both fail the
    comparison above: the check can tell the two releases apart."""
    old = [r for r in ROOTS if release(version_of(r)) < (0, 5, 13)]
    new = [r for r in ROOTS if release(version_of(r)) >= (0, 5, 13)]
    if not (old and new):
        pytest.skip(f"needs one SGLang release before 0.5.13 and one after, installed: "
                    f"{[version_of(r) for r in ROOTS]}; {INSTALL_HINT}")
    newest = get_convention(SglangEngine.convention)
    wrong_for_old = disagreements(old[0], "deepseek_v2", newest)
    wrong_for_new = disagreements(new[-1], "deepseek_v2", get_convention("sglang"))
    assert any("ids [2, 4, 5]:" in d for d in wrong_for_old), wrong_for_old[:3]
    assert any("ids [2, 4, 5]:" in d for d in wrong_for_new), wrong_for_new[:3]
    assert layers_to_capture(old[0], "deepseek_v2", [2, 4, 5]) == [3, 5, 6]
    assert layers_to_capture(new[-1], "deepseek_v2", [2, 4, 5]) == [2, 4, 5]


# -- the observed-convention entry of docs/CONFORMANCE.md -----------------------------------

CONFORMANCE = REPO_ROOT / "docs" / "CONFORMANCE.md"


def observed_rows(root: Path, tmp_path: Path) -> list[str]:
    """One row per bundle draft and config layout: what this release reads, the layers it
    sets on the bundle's DeepSeek target, what its capture loop then fills, against training."""
    version = version_of(root)
    conv = _expected(root, "deepseek_v2")
    manifest = json.loads((BUNDLE / "manifest.json").read_text())
    rows = []
    for name, draft in sorted(manifest["drafts"].items()):
        trained = tuple(draft["boundaries"])
        for fmt in ("nested", "top-level"):
            folder = tmp_path / f"{version}-{name}-{fmt}"
            folder.mkdir()
            config = json.loads((BUNDLE / draft["folder"] / "config.json").read_text())
            ids = config.pop("eagle_config")["eagle_aux_hidden_state_layer_ids"]
            config.update({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
                          if fmt == "nested" else {"eagle_aux_hidden_state_layer_ids": ids})
            (folder / "config.json").write_text(json.dumps(config))
            read = read_layer_ids(root, transformers.AutoConfig.from_pretrained(folder))
            layers = layers_to_capture(root, "deepseek_v2", read)
            got = engine_outcome(layers, len(ids), conv)
            verdict = "as trained" if got == trained else "**wrong**"
            rows.append(f"| {version} | {name} | {fmt} | {list(ids)} | {read} | {layers} | "
                        f"{list(got) if isinstance(got, tuple) else got} | {list(trained)} | {verdict} |")
    return rows


def test_conformance_md_holds_the_observed_convention(root: Path, tmp_path: Path) -> None:
    """The SGLang section of docs/CONFORMANCE.md is written by hand; its observed-convention
    rows must be what the installed release does (regenerate them from this message)."""
    rows = observed_rows(root, tmp_path)
    text = CONFORMANCE.read_text()
    missing = [r for r in rows if r not in text]
    assert not missing, "docs/CONFORMANCE.md lacks or contradicts these rows:\n" + "\n".join(rows)


def test_regenerating_the_table_keeps_the_sglang_section() -> None:
    """conformance-table rewrites docs/CONFORMANCE.md from reports; the SGLang section has
    none, so it must be carried over whole."""
    from harness.reports.report_md import kept_sections

    text = CONFORMANCE.read_text()
    kept = kept_sections(text)
    assert "## sglang (source checks; no GPU run yet)" in kept
    assert text.split("<!-- kept: sglang -->", 1)[1].split("<!-- /kept -->")[0] in kept
