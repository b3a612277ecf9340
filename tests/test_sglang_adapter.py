"""The SGLang adapter against SGLang's real source, for what needs no GPU: the engine
arguments are ServerArgs fields, the meta_info keys it reads are ones SGLang writes, the
capture route (an external model package replacing `LlamaForCausalLMEagle3`) is honoured by
SGLang's model registry and finds the attributes it hooks, and without SGLang or a GPU the
adapter is unavailable with a reason instead of failing.

The installed source is read through its AST (tests/sglang_source.py). Where a release
imports without its own dependencies, the real class and registry are also executed, in a
subprocess so that this session never imports SGLang, and a skip says where they are not:
0.5.23's server_args and model registry import beside vLLM's environment plus orjson and
IPython (the development machine, not a fresh CI environment); 0.5.12.post1's package
__init__ needs torchvision.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_source import (
    find_method,
    installed_roots,
    release_params,
    source_writes,
    version_of,
)

from harness.engines.base import EngineOptions, EngineUnavailable
from harness.engines.sglang import (
    GENERATE_ARGS,
    META_COMPLETION_TOKENS,
    META_HISTOGRAMS,
    META_VERIFY_CT,
    OUTPUT_IDS,
    SAMPLING_KEYS,
    SglangEngine,
    acceptance_from_meta,
    convention_for,
    engine_kwargs,
)

ROOTS = installed_roots()
BUNDLE = Path(__file__).resolve().parents[1] / "golden" / "tiny-dsv3"
OPTIONS = EngineOptions(dtype="bfloat16", device="cuda", num_draft_tokens=4)


@pytest.fixture(params=release_params())
def root(request: pytest.FixtureRequest) -> Path:
    return request.param


def _annotated(tree: ast.AST, classes: str | None = None) -> set[str]:
    """Annotated attribute names of the class bodies in `tree` (of class `classes` only)."""
    return {n.target.id for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
            and classes in (None, c.name)
            for n in c.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _server_args_fields(root: Path) -> set[str]:
    """ServerArgs' fields read from the source: up to 0.5.2x a dataclass (its annotated
    class attributes), in 0.5.23 a msgspec Struct assembled from the namespaces of
    arg_groups/fields/ (their annotated attributes). Held against the imported class by
    test_server_args_fields_read_from_source_are_the_real_ones."""
    tree = ast.parse((root / "sglang/srt/server_args.py").read_text())
    cls = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "ServerArgs")
    if any("dataclass" in ast.unparse(d) for d in cls.decorator_list):
        return _annotated(cls, "ServerArgs")
    groups = sorted((root / "sglang/srt/arg_groups/fields").glob("*.py"))
    assert groups, f"{version_of(root)} ServerArgs is no dataclass and has no arg_groups/fields"
    return set().union(*(_annotated(ast.parse(p.read_text())) for p in groups))


def _run_installed(root: Path, code: str, env: dict[str, str] | None = None) -> dict | None:
    """Run `code` (printing one JSON line) with only this release on the path; None where
    the release does not import without its dependencies (the reason is printed)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {}),
                                            "PYTHONPATH": os.pathsep.join(filter(None, [str(root), (env or {}).get("EXTRA_PATH")]))})
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        if "ModuleNotFoundError" in last:
            print(f"{version_of(root)} does not import without its dependencies: {last}")
            return None
        raise AssertionError(f"{version_of(root)}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_engine_arguments_are_server_args_fields(root: Path) -> None:
    fields = _server_args_fields(root)
    for draft in (None, BUNDLE / "draft-specforge-default"):
        unknown = set(engine_kwargs(BUNDLE / "target", draft, OPTIONS)) - fields
        assert not unknown, f"{version_of(root)} ServerArgs has no {sorted(unknown)}"
    # the algorithm name is a member of SGLang's SpeculativeAlgorithm enum
    members = {t.id for c in ast.parse((root / "sglang/srt/speculative/spec_info.py").read_text()).body
               if isinstance(c, ast.ClassDef) and c.name == "SpeculativeAlgorithm"
               for n in c.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert engine_kwargs(BUNDLE / "target", BUNDLE, OPTIONS)["speculative_algorithm"] in members


def test_server_args_fields_read_from_source_are_the_real_ones(root: Path) -> None:
    """The source reading above against the imported class, where the release imports
    without its dependencies (0.5.23 with vLLM's environment; not 0.5.12.post1)."""
    real = _run_installed(root, (
        "import dataclasses, json\nfrom sglang.srt.server_args import ServerArgs\n"
        "f = getattr(ServerArgs, '__struct_fields__', None) or "
        "[x.name for x in dataclasses.fields(ServerArgs)]\nprint(json.dumps(sorted(f)))"))
    if real is None:
        pytest.skip(f"{version_of(root)}: server_args does not import without SGLang's "
                    f"dependencies here; its fields were read from source only")
    assert set(real) == _server_args_fields(root)


def test_the_external_model_package_replaces_sglangs_draft_class(root: Path, tmp_path: Path) -> None:
    """SGLang's own registry, given SGLANG_EXTERNAL_MODEL_PACKAGE, resolves the draft's
    architecture to the external class (the adapter's capture route)."""
    pkg = tmp_path / "ext_models"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rec.py").write_text("class LlamaForCausalLMEagle3:\n    pass\n\n"
                                "EntryClass = [LlamaForCausalLMEagle3]\n")
    resolved = _run_installed(root, (
        "import json\nfrom sglang.srt.models.registry import ModelRegistry\n"
        "cls, arch = ModelRegistry.resolve_model_cls(['LlamaForCausalLMEagle3'])\n"
        "print(json.dumps([cls.__module__, arch]))"),
        env={"SGLANG_EXTERNAL_MODEL_PACKAGE": "ext_models", "EXTRA_PATH": str(tmp_path)})
    if resolved is None:
        registry = (root / "sglang/srt/models/registry.py").read_text()
        assert "SGLANG_EXTERNAL_MODEL_PACKAGE" in registry  # read, not executed, here
        pytest.skip(f"{version_of(root)}: the registry does not import without SGLang's "
                    f"dependencies here; only its source was read")
    assert resolved == ["ext_models.rec", "LlamaForCausalLMEagle3"]


def test_the_recorder_hooks_what_sglangs_draft_has(root: Path) -> None:
    """The recorder hooks LlamaForCausalLMEagle3.model (forward_batch third after self,
    hidden states from forward_batch.spec_info) and model.fc; fc is skipped on a width match."""
    module = "sglang/srt/models/llama_eagle3.py"
    forward = find_method(root, module, "LlamaModel", "forward")
    assert [a.arg for a in forward.args.args][:4] == ["self", "input_ids", "positions", "forward_batch"]
    body = ast.unparse(forward)
    assert "forward_batch.spec_info.hidden_states" in body
    assert "hidden_states.shape[-1] != embeds.shape[-1]" in body  # the width-match skip
    assert "self.fc = " in ast.unparse(find_method(root, module, "LlamaModel", "__init__"))
    assert "self.model = LlamaModel(" in ast.unparse(
        find_method(root, module, "LlamaForCausalLMEagle3", "__init__"))


def test_the_meta_info_keys_read_are_written_by_sglang(root: Path) -> None:
    written = source_writes(root, "sglang/srt/managers/tokenizer_manager.py", "meta_info")
    assert {META_COMPLETION_TOKENS, META_VERIFY_CT} <= written, sorted(written)
    histograms = [k for k in META_HISTOGRAMS if k in written]
    assert histograms, f"{version_of(root)} writes none of {META_HISTOGRAMS}"
    print(f"{version_of(root)} writes histogram keys {histograms}")


def test_the_request_the_worker_sends_is_sglangs(root: Path) -> None:
    """Engine.generate takes input_ids and sampling_params, SamplingParams has the greedy
    keys, and an output carries its generated ids under `output_ids`."""
    generate = find_method(root, "sglang/srt/entrypoints/engine.py", "Engine", "generate")
    assert set(GENERATE_ARGS) <= {a.arg for a in generate.args.args}
    sampling = ast.unparse(next(n for n in ast.parse(
        (root / "sglang/srt/sampling/sampling_params.py").read_text()).body
        if isinstance(n, ast.ClassDef) and n.name == "SamplingParams"))
    missing = [k for k in SAMPLING_KEYS if f"{k}:" not in sampling]  # a field or an __init__ arg
    assert not missing, f"{version_of(root)} SamplingParams lacks {missing}"
    assert OUTPUT_IDS in source_writes(root, "sglang/srt/managers/tokenizer_manager.py", "out")


def test_acceptance_from_meta_info() -> None:
    k = 4
    # 3 verify steps accepting 4, 1 and 0 drafts; 1 + (5 + 2 + 1) tokens
    meta = {META_VERIFY_CT: 3, META_COMPLETION_TOKENS: 9, META_HISTOGRAMS[0]: [1, 1, 0, 0, 1]}
    a = acceptance_from_meta(meta, k)
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (3, 12, 5)
    assert a.accepted_per_pos == [2, 1, 1, 1]
    assert acceptance_from_meta({META_COMPLETION_TOKENS: 1}, k).num_drafts == 0
    alias = {META_VERIFY_CT: 3, META_HISTOGRAMS[1]: [1, 1, 0, 0, 1]}
    assert acceptance_from_meta(alias, k) == a
    with pytest.raises(RuntimeError, match="histogram counts 2 verify steps"):
        acceptance_from_meta({META_VERIFY_CT: 3, META_HISTOGRAMS[0]: [1, 1]}, k)
    with pytest.raises(RuntimeError, match="update the adapter's keys"):
        acceptance_from_meta({META_VERIFY_CT: 3}, k)


def test_convention_follows_architecture_and_release() -> None:
    assert convention_for("DeepseekV3ForCausalLM", "0.5.23") == SglangEngine.convention
    assert convention_for("DeepseekV3ForCausalLM", "0.5.12.post1") == "sglang"
    assert convention_for("DeepseekV3ForCausalLM", "0.5.13") == "sglang-deepseek"
    assert convention_for("LlamaForCausalLM", "0.5.21") == "sglang"
    assert convention_for("LlamaForCausalLM", "0.5.23") == "sglang-stages"
    with pytest.raises(EngineUnavailable, match="GptOssForCausalLM"):
        convention_for("GptOssForCausalLM", "0.5.23")


def test_the_checks_see_the_rule_an_instance_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer-id checks and the doctor ask the class for a target's rule before any engine
    starts (`convention_for_target`): it must be the one an instance sets, the installed
    release's for the target's architecture; the class default only without SGLang."""
    import harness.engines.sglang as sg

    golden = Path(__file__).resolve().parents[1] / "golden"
    monkeypatch.setattr(sg, "_sglang_version", lambda: "0.5.12.post1")
    assert SglangEngine.convention_for_target(golden / "tiny-dsv3" / "target") == "sglang"
    monkeypatch.setattr(sg, "_sglang_version", lambda: "0.5.23")
    assert SglangEngine.convention_for_target(golden / "tiny-dsv3" / "target") == "sglang-deepseek-stages"
    assert SglangEngine.convention_for_target(golden / "tiny-qwen3moe" / "target") == "sglang-stages"
    monkeypatch.setattr(sg, "_sglang_version", lambda: None)
    assert SglangEngine.convention_for_target(golden / "tiny-qwen3moe" / "target") == SglangEngine.convention


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_unavailable_with_a_reason_without_sglang_or_gpu(device: str) -> None:
    """Here (no sglang in the environment, no GPU) the adapter must say so, not fail."""
    import importlib.util

    import torch

    if importlib.util.find_spec("sglang") is not None and torch.cuda.is_available():
        pytest.skip("SGLang and a GPU are present: the adapter is available here")
    with pytest.raises(EngineUnavailable, match="sglang is not installed|CUDA GPU") as info:
        SglangEngine(BUNDLE / "target", BUNDLE / "draft-specforge-default",
                     EngineOptions(device=device))
    print(f"SglangEngine unavailable ({device}): {info.value}")
