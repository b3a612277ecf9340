"""Run options are defined once (harness.run.options): the CLI's `run` and the pytest plugin offer
the same flags with the same defaults and choices, the CLI forwards them to pytest unchanged,
and both refuse a bad value with the same one line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness import cli
from harness.run.options import RUN_OPTIONS, OptionError, add_run_options, forward, validate

pytest_plugins = ["pytester"]


def _run_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["run"]


def test_cli_run_offers_every_run_option_as_defined() -> None:
    actions = {a.dest: a for a in _run_parser()._actions}
    for opt in RUN_OPTIONS:
        a = actions[opt.dest]
        assert (a.option_strings, a.default, a.choices, a.help) == (
            [opt.flag], opt.default, opt.choices, opt.help)


def test_the_plugin_registers_the_same_options(pytestconfig: pytest.Config) -> None:
    for opt in RUN_OPTIONS:
        assert pytestconfig.getoption(opt.dest) is not None or opt.default is None


def test_forward_passes_every_value_on_unchanged() -> None:
    argv = ["--engine", "zoo:x", "--bundle", "b", "--draft", "d1", "--draft", "d2",
            "--dtype", "bfloat16", "--device", "cuda", "--num-draft-tokens", "3",
            "--report-dir", "out", "--xfails", "x.txt"]
    given = vars(_run_parser().parse_args(argv))
    plain = argparse.ArgumentParser()
    add_run_options(plain.add_argument)
    assert vars(plain.parse_args(forward(given))) == {o.dest: given[o.dest] for o in RUN_OPTIONS}


@pytest.mark.parametrize(("change", "needle"), [
    ({"num_draft_tokens": 0}, "--num-draft-tokens 0 is out of range; use 1..32"),
    ({"engine_timeout_scale": -1.0}, "--engine-timeout-scale -1.0 is not a factor"),
    ({"engine": "no such"}, "unknown engine 'no such'"),
    ({"xfails": "/nowhere/x.txt"}, "--xfails /nowhere/x.txt does not exist"),
])
def test_one_validation_for_cli_and_plugin(change: dict, needle: str, pytester: pytest.Pytester,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    values = {o.dest: o.default for o in RUN_OPTIONS} | change
    with pytest.raises(OptionError, match=needle):
        validate(values)
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in change.items()]
    assert cli.main(["run", *argv]) == 2
    assert needle in capsys.readouterr().err
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(*argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert needle in result.stderr.str()


def test_a_committed_bundle_is_found_by_its_name_from_anywhere(tmp_path, monkeypatch) -> None:
    """`--bundle tiny-qwen3moe` (or golden/tiny-qwen3moe) from a folder without one names the
    committed copy (outside a checkout the only way to reach the second bundle); a folder of
    that name where the run starts is the user's and wins; any other missing name stays
    missing and is refused in one line."""
    from harness.golden.paths import committed_bundle_path
    from harness.run.options import bundle_arg_problem, bundle_path

    monkeypatch.chdir(tmp_path)
    committed = committed_bundle_path("tiny-qwen3moe")
    assert committed.is_dir()
    assert bundle_path("tiny-qwen3moe") == committed
    assert bundle_path("golden/tiny-qwen3moe") == committed
    assert bundle_arg_problem("tiny-qwen3moe") is None
    assert bundle_path("elsewhere/tiny-qwen3moe") == Path("elsewhere/tiny-qwen3moe")
    assert "does not exist" in bundle_arg_problem("tiny-nothing")
    assert "does not exist" in bundle_arg_problem("elsewhere/tiny-qwen3moe")
    (tmp_path / "tiny-qwen3moe").mkdir()
    assert bundle_path("tiny-qwen3moe") == Path("tiny-qwen3moe")
    with pytest.raises(OptionError, match="empty|--bundle"):
        validate({**{o.dest: o.default for o in RUN_OPTIONS}, "engine": "reference",
                  "bundle": ""})
