"""Executing pieces of an installed SGLang release without importing it.

The installed releases live in folders made by `pip install --no-deps --target` (scripts/
test.sh puts the pinned ones under `.sglang/<version>`; `SGLANG_SOURCES` may name others,
separated by os.pathsep). Importing `sglang.srt.models.llama` (or deepseek_v2, or the model
runner) needs SGLang's whole dependency tree: the first missing module is torchvision
(sglang/srt/utils/common.py imports torchvision.io at import time), then triton,
sgl-kernel and flashinfer, and a stub torchvision breaks transformers' own version probe.
The functions checked here are small and read only their arguments and `self`, so the
narrowest faithful way to run them is to compile *that function's source from the
installed file* (filename kept, so tracebacks point into the release) and call it on
stand-in objects holding just the attributes it reads. Nothing of SGLang is re-typed or
stubbed: if a release makes the function read a module global, `installed_function`
refuses with the name instead of guessing.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional  # noqa: UP035 - the names SGLang's annotations use

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SOURCES = REPO_ROOT / ".sglang"
INSTALL_HINT = ("pip install --no-deps --target .sglang/<version> sglang==<version> "
                "(bash scripts/test.sh installs the pinned ones)")
_TYPING = {"Optional": Optional, "List": list}


def installed_roots() -> list[Path]:
    """Folders holding an installed sglang package, from SGLANG_SOURCES or .sglang/*."""
    listed = os.environ.get("SGLANG_SOURCES")
    if listed:
        roots = [Path(p) for p in listed.split(os.pathsep) if p]
    else:
        roots = sorted(DEFAULT_SOURCES.glob("*")) if DEFAULT_SOURCES.is_dir() else []
    return [r for r in roots if (r / "sglang").is_dir()]


def release_params() -> list[Any]:
    """pytest params, one per installed release (id: its version), or one that skips saying
    how to install them."""
    import pytest

    roots = installed_roots()
    if not roots:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"no SGLang release installed for source checks: {INSTALL_HINT}"))]
    return [pytest.param(r, id=version_of(r)) for r in roots]


def version_of(root: Path) -> str:
    for dist in importlib.metadata.distributions(path=[str(root)]):
        if dist.metadata["Name"] == "sglang":
            return dist.version
    raise LookupError(f"{root} holds no sglang distribution metadata; reinstall it with "
                      f"{INSTALL_HINT}")


@functools.cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def find_method(root: Path, module: str, cls: str, name: str) -> ast.FunctionDef:
    path = root / module
    for node in _parse(path).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise LookupError(f"{module} of {root.name} has no {cls}.{name}")


def _free_names(node: ast.AST, bound: set[str]) -> set[str]:
    """Names the code loads that are neither bound inside it nor builtins."""
    stored = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if isinstance(node, ast.FunctionDef):
        a = node.args
        stored |= {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    loaded = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - stored - bound - set(dir(builtins))


@functools.cache
def installed_function(root: Path, module: str, cls: str, name: str) -> Callable[..., Any]:
    """`cls.name` of the installed release, compiled from its file, as a plain function
    whose first argument is the stand-in `self`."""
    node = find_method(root, module, cls, name)
    if node.decorator_list:
        raise LookupError(f"{cls}.{name} in {root.name} is decorated; executing it alone "
                          f"would skip the decorator")
    free = _free_names(node, set(_TYPING))
    if free:
        raise LookupError(f"{cls}.{name} in {root.name} reads module globals {sorted(free)}; "
                          f"they would have to be provided to execute it alone")
    namespace: dict[str, Any] = dict(_TYPING)
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(root / module), "exec"), namespace)
    return namespace[name]


def _reads_nested_ids(node: ast.Try) -> bool:
    return any(isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)
               and n.slice.value == "eagle_aux_hidden_state_layer_ids" for n in ast.walk(node))


def id_reader(root: Path) -> tuple[Path, ast.Try]:
    """The model runner's `try: ... eagle_config["eagle_aux_hidden_state_layer_ids"] ...
    except` block, wherever the release keeps it (model_runner.py up to 0.5.2x,
    model_runner_components/spec_aux_hidden_state.py in 0.5.23). Exactly one must exist."""
    found = [(path, node) for path in sorted((root / "sglang/srt/model_executor").rglob("*.py"))
             for node in ast.walk(_parse(path)) if isinstance(node, ast.Try) and _reads_nested_ids(node)]
    if len(found) != 1:
        raise LookupError(f"{root.name}: expected one try block reading eagle_config"
                          f"['eagle_aux_hidden_state_layer_ids'] in model_executor, found "
                          f"{[str(p.relative_to(root)) for p, _ in found]}")
    return found[0]


def run_block(path: Path, block: ast.stmt, local: dict[str, Any]) -> dict[str, Any]:
    """Execute one statement of the installed file on the given local names."""
    free = _free_names(block, set(local))
    if free:
        raise LookupError(f"the block at {path.name}:{block.lineno} reads {sorted(free)}, "
                          f"which the stand-ins do not provide")
    exec(compile(ast.Module(body=[block], type_ignores=[]), str(path), "exec"), {}, local)
    return local


def capture_adds_residual(root: Path, module: str, cls: str) -> bool:
    """Whether `cls.forward` captures `hidden_states + residual` under `if i in
    self.layers_to_capture` (the pre-stage capture, which fails before layer 0 where the
    residual is still None). False: the forward hands the capture to the layer instead."""
    forward = find_method(root, module, cls, "forward")
    for node in ast.walk(forward):
        if isinstance(node, ast.If) and "layers_to_capture" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add)
                        and {ast.unparse(sub.left), ast.unparse(sub.right)} == {"hidden_states", "residual"}):
                    return True
    return False


def source_writes(root: Path, module: str, dict_name: str) -> set[str]:
    """Every constant key the module assigns into `dict_name[...]` or writes as a key of a
    dict literal: what that dict can hold."""
    keys: set[str] = set()
    for node in ast.walk(_parse(root / module)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if (isinstance(t, ast.Subscript) and ast.unparse(t.value) == dict_name
                    and isinstance(t.slice, ast.Constant)):
                keys.add(t.slice.value)
        if isinstance(node, ast.Dict):
            keys |= {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return keys
