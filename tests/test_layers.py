"""The layering the house rules promise, checked on the import statements themselves (lazy
imports inside functions included). The packages of harness/ stack bottom to top as LAYERS
lists them (docs/DESIGN.md, "The house"); a module imports from its own package and those
below, never from one above, and nothing imports the command line. Besides: core imports
nothing of the package; the diagnosis names causes and never runs an engine; what every pytest
start loads through the plugin (core, reports, the diagnosis record) imports no torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "harness"


def imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from harness.run import timeouts` reaches harness.run.timeouts, not only the package
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


# Bottom to top. A package may import the packages before it, never one after it.
LAYERS = ("core", "models", "engines", "golden", "diagnosis", "reports", "judgement", "run", "tools")
# The top: the public adapter API (imports engines and core) and the command line (imports
# every layer); no package imports either.
TOP = ("harness.adapter", "harness.cli", "harness.cli_help")


def above(package: str) -> tuple[str, ...]:
    return tuple(f"harness.{p}" for p in LAYERS[LAYERS.index(package) + 1:]) + TOP


# What a package may not import besides the packages above it, and why.
BESIDES = {
    "core": ("torch", "harness"),  # imported by every layer, and by every pytest start
    "diagnosis": ("harness.engines",),  # words causes from evidence, never runs an engine
    "reports": ("torch",),  # the plugin imports the report at every pytest start
}
RULES = [(f"{p}/**/*.py", above(p) + BESIDES.get(p, ())) for p in LAYERS] + [
    ("diagnosis/record.py", ("torch",)),
    ("diagnosis/crash.py", ("torch",)),
    ("diagnosis/observed_convention.py", ("torch",)),  # the report renders it
    ("adapter.py", tuple(f"harness.{p}" for p in LAYERS if p not in ("core", "engines")) + TOP),
    ("schemas/*.py", ("harness",)),  # the JSON Schemas and their validator, beside the layers
]


@pytest.mark.parametrize(("pattern", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_no_module_reaches_up(pattern: str, forbidden: tuple[str, ...]) -> None:
    files = sorted(HARNESS.glob(pattern))
    assert files, f"no module matches {pattern}"
    bad = {f.relative_to(HARNESS).as_posix(): sorted(m for m in imports(f)
                                                    if any(m == x or m.startswith(x + ".")
                                                           for x in forbidden))
           for f in files}
    assert not {k: v for k, v in bad.items() if v}


def test_every_module_has_a_place_in_the_layers() -> None:
    """A new module goes into the package its concern names (or a new package gets a place in
    LAYERS and in docs/DESIGN.md's tree), so the tree keeps showing the architecture: the top
    level holds only the public adapter API and the command line."""
    top = sorted(p.name for p in HARNESS.glob("*.py"))
    assert top == ["__init__.py", "adapter.py", "cli.py", "cli_help.py"], top
    packages = sorted(p.name for p in HARNESS.iterdir() if (p / "__init__.py").is_file())
    assert packages == sorted((*LAYERS, "schemas")), packages


def test_the_old_diagnose_module_is_gone() -> None:
    assert not (HARNESS / "diagnose.py").exists()


def test_no_test_module_name_is_shared_by_tests_and_suites() -> None:
    """pytest's default import mode names a test module by its file name alone, so a name in
    both tests/ and suites/ makes `eagle3-conformance run` called in-process after the unit
    tests were collected (as tests/test_bad_input_golden.py does) fail to collect the suite
    module ("import file mismatch"): CI failed on exactly this with test_canary.py and
    test_decode_inputs.py."""
    root = HARNESS.parent
    shared = ({p.name for p in (root / "tests").glob("test_*.py")}
              & {p.name for p in (root / "suites").glob("test_*.py")})
    assert not shared, (f"test modules named alike in tests/ and suites/: {sorted(shared)}; "
                        f"rename the one in tests/")


def _module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle_in_the_package() -> None:
    """No module of the package reaches itself through imports (lazy ones inside functions
    included): a circle hides which module is the lower one. engines/sglang.py and
    engines/_sglang_worker.py were one, until their shared vocabulary moved into
    engines/_sglang_protocol.py."""
    modules = {_module_name(p): p for p in HARNESS.rglob("*.py")}

    graph = {name: {m for m in imports(path) if m in modules and m != name}
             for name, path in modules.items()}
    state: dict[str, int] = {}  # 1 on the path being walked, 2 done
    circles: list[list[str]] = []

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_every_slow_test_says_why() -> None:
    """The fast tier (`pytest -m "not slow" tests`) leaves out what carries the slow marker;
    each says why it is slow, so the next maintainer can tell a slow test from a slow bug."""
    bare = []
    for path in (HARNESS.parent / "tests").glob("test_*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr == "slow"
                    and isinstance(node.value, ast.Attribute) and node.value.attr == "mark"):
                continue
            call = calls.get(id(node))  # None: the bare marker, without a call
            reason = None if call is None else next(
                (k.value for k in call.keywords if k.arg == "reason"), None)
            if not (isinstance(reason, ast.Constant) and str(reason.value).strip()):
                bare.append(f"{path.name}:{node.lineno}")
    assert not bare, f"slow markers without reason=...: {bare}"
