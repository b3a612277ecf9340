"""The pytest plugin (entry point `eagle3_conformance`): options, fixtures, xfails, the report.

Every check runs once per draft of the bundle (`draft_name` is a session-scoped parameter, so
pytest groups the checks by draft and each engine is built once per draft and closed when the
next draft's begins, never two engines alive at once). A check fails through
`harness.judgement.assertions.fail` (a `harness.reports.report.ConformanceFailure(message, diagnoses)`, which
attaches the diagnoses to the check in report.json). An `EngineCrash` out of a check is turned
into one here, diagnosed against the draft's spec, since this is the layer that holds it.

The plugin is loaded in every pytest run of an environment where the package is installed,
so it stays inert until a test asks for one of its fixtures, and imports torch only then.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import InvalidArgument

from harness.diagnosis.record import failing_diagnoses
from harness.judgement.verdict import set_run_engine
from harness.reports.certificate import certificate_files
from harness.reports.outcomes import check_outcome, exception_message, root_failure
from harness.reports.report import ReportCollector, verdict_line, write_reports
from harness.run import distributed, profiles
from harness.run.options import (
    RUN_OPTIONS,
    OptionError,
    add_run_options,
    prepare_report_dir,
    validate,
)
from harness.run.pytest_modes import non_run_mode
from harness.run.registry import engine_path
from harness.run.session import State
from harness.run.xfails import XfailRule, XfailsError, check_id, default_xfails_path, read_xfails

PLUGIN_FIXTURES = frozenset({"bundle", "draft_name", "engine", "engine_class", "engine_options",
                             "report"})
JUNIT_PARTIAL = ".junit.xml.partial"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_run_options(parser.getgroup("eagle3-conformance", "EAGLE-3 conformance").addoption)


_KEY = pytest.StashKey[State]()


def _state(config: pytest.Config) -> State:
    return config.stash[_KEY]


# -- configuration ---------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter and junitxml read the options
def pytest_configure(config: pytest.Config) -> None:
    report_dir = config.getoption("report_dir")
    try:
        if report_dir is not None:  # first, so that even a run refused below leaves no stale report
            prepare_report_dir(report_dir)
        validate({opt.dest: config.getoption(opt.dest) for opt in RUN_OPTIONS})
    except OptionError as e:
        raise pytest.UsageError(str(e)) from None
    name = config.getoption("engine")
    # a dotted path is the one --engine value an adapter's `name` does not repeat
    set_run_engine(name if ":" in name and not name.startswith("zoo:") else None)
    if not config.getoption("--hypothesis-profile", None):
        try:
            profiles.load_default_profile()
        except InvalidArgument as e:
            raise pytest.UsageError(f"HYPOTHESIS_PROFILE: {e}; use one of "
                                    f"{', '.join(profiles.PROFILES)}") from None
    chars = config.option.reportchars or ""
    if "N" not in chars:  # skip and xfail reasons always shown, unless -rN asks for silence
        config.option.reportchars = chars + "".join(c for c in "sx" if c not in chars)
    state = State(config, name, Path(report_dir) if report_dir else None)
    if state.report_dir is not None:
        if hasattr(config.option, "xmlpath") and not config.option.xmlpath:
            state.junit_tmp = state.report_dir / JUNIT_PARTIAL
            config.option.xmlpath = str(state.junit_tmp)
    config.stash[_KEY] = state


def pytest_sessionstart(session: pytest.Session) -> None:
    # after Hypothesis' own pytest plugin loaded --hypothesis-profile (its configure runs after ours)
    profiles.apply_shrink_limit()


def pytest_report_header(config: pytest.Config) -> str:
    given = config.getoption("bundle") or "golden/tiny-dsv3 (default)"
    return (f"eagle3-conformance: engine {config.getoption('engine')}, bundle {given}, "
            f"hypothesis profile {hypothesis_settings.get_current_profile_name()}")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "draft_name" not in metafunc.fixturenames:
        return
    if any("draft_name" in str(m.args[0] if m.args else "")
           for m in metafunc.definition.iter_markers("parametrize")):
        return  # the test parametrizes it itself
    try:
        names = _state(metafunc.config).drafts()
    except pytest.UsageError:
        return  # raised once, whole, after collection: not as one error per test module
    metafunc.parametrize("draft_name", names, ids=names, indirect=True, scope="session")


def _is_check(item: pytest.Item) -> bool:
    """A check of the engine: a test of the suites, or one that asks for the plugin's own
    fixtures (an adapter's tests may). A test whose module defines a fixture of the same
    name (a unit test's own `bundle`) does not use the plugin's and is no check: counting it
    printed a verdict banner, "nonconformant", under a unit-test session."""
    info = getattr(item, "_fixtureinfo", None)
    for name in PLUGIN_FIXTURES & set(getattr(item, "fixturenames", ())):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if not defs or getattr(defs[-1].func, "__module__", None) == __name__:
            return True
    from harness.golden.paths import suites_path

    return Path(item.path).resolve().is_relative_to(suites_path().resolve())


def pytest_collection_finish(session: pytest.Session) -> None:
    state = _state(session.config)
    if state.usage_error:
        raise pytest.UsageError(state.usage_error)
    checks = [item for item in session.items if _is_check(item)]
    if not checks:
        return
    state.conformance_run = True
    if any("bundle" in item.fixturenames for item in checks):
        state.bundle()  # bad input stops the run here, before any check
    if any("engine" in item.fixturenames or "engine_class" in item.fixturenames for item in checks):
        state.resolve()
    given = session.config.getoption("xfails")
    if given:
        state.xfails_path = Path(given)
    else:
        from harness.golden.paths import suites_path

        bundle_name = state.bundle().name if state._bundle is not None else None
        state.xfails_path = default_xfails_path(suites_path() / "xfails", state.engine_name, bundle_name)
    try:
        rules = read_xfails(state.xfails_path)
    except XfailsError as e:
        state.usage_error = str(e)
        raise pytest.UsageError(state.usage_error) from None
    used: set[XfailRule] = set()
    for item in checks:
        params = getattr(getattr(item, "callspec", None), "params", {})
        cid = check_id(item.nodeid)
        record = state.collector.check(cid, item.nodeid, params.get("draft_name"),
                                       uses_engine="engine" in item.fixturenames)
        rule = next((r for r in rules if r.matches(cid, item.nodeid)), None)
        if rule is not None:
            used.add(rule)
            record.xfail_reason = f"{rule.reason} ({rule.where})"
            item.add_marker(pytest.mark.xfail(reason=f"known nonconformance: {record.xfail_reason}",
                                              strict=True))
    state.unmatched_xfails = [f"{r.pattern} ({r.where})" for r in rules if r not in used]


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items and _KEY in items[0].config.stash:
        _state(items[0].config).deselected += sum(_is_check(item) for item in items)


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def report(pytestconfig: pytest.Config) -> ReportCollector:
    """Record metrics (`report.metric(draft, key, value)`) and diagnoses
    (`report.diagnosis(None, diag)` for the running check) into report.json."""
    return _state(pytestconfig).collector


@pytest.fixture(scope="session")
def bundle(pytestconfig: pytest.Config) -> Any:
    """The golden bundle (harness.golden.bundle.Bundle), loaded and verified once."""
    return _state(pytestconfig).bundle()


@pytest.fixture(scope="session")
def draft_name(request: pytest.FixtureRequest) -> str:
    """The draft this check runs for; every check using it runs once per selected draft."""
    param = getattr(request, "param", None)
    return param if param is not None else _state(request.config).drafts()[0]


@pytest.fixture(scope="session")
def engine_class(pytestconfig: pytest.Config) -> type:
    """The adapter class --engine names; skips (with the reason) if the engine cannot run here."""
    state = _state(pytestconfig)
    state.resolve()
    if state.engine_problem:
        pytest.skip(state.engine_problem)
    assert state.engine_cls is not None
    return state.engine_cls


@pytest.fixture(scope="session")
def engine_options(pytestconfig: pytest.Config, engine_class: type) -> Any:
    """The run's EngineOptions (no training convention: that is the draft's). Under
    pytest-xdist, plain `--device cuda` puts worker gwN on cuda:(N mod GPUs)."""
    from harness.engines.base import EngineOptions

    device = pytestconfig.getoption("device")
    if device == "cuda" and distributed.is_worker(pytestconfig):
        import torch

        device = distributed.worker_device(device, distributed.worker_index(pytestconfig),
                                           torch.cuda.device_count())
    return EngineOptions(dtype=_state(pytestconfig).dtype() or "float32", device=device,
                         num_draft_tokens=pytestconfig.getoption("num_draft_tokens"))


@pytest.fixture(scope="session")
def engine(pytestconfig: pytest.Config, engine_class: type, engine_options: Any, bundle: Any,
           draft_name: str, report: ReportCollector) -> Any:
    """The engine serving the bundle's target with this draft: built once per draft, closed
    when the checks move to the next draft (or at session end)."""
    from dataclasses import replace

    from harness.engines.base import EngineUnavailable
    from harness.run import timeouts

    state = _state(pytestconfig)
    options = replace(engine_options,
                      training_convention=getattr(bundle.draft(draft_name), "convention", None))
    if state.hung:
        pytest.skip(state.hung)
    budget = timeouts.CallBudget(scale=pytestconfig.getoption("engine_timeout_scale"))
    try:
        instance, budget = timeouts.start_measured(
            lambda: engine_class(bundle.target_dir, bundle.draft_dir(draft_name), options), budget,
            engine_class)
    except (EngineUnavailable, timeouts.EngineHang) as e:
        state.engine_problem = f"engine {state.engine_name} unavailable: {e}"
        report.engine_unavailable = state.engine_problem
        pytest.skip(state.engine_problem)
    timeouts.BoundedCalls(instance, budget, on_hang=lambda why: setattr(state, "hung", why))
    report.engine_constructions[draft_name] = report.engine_constructions.get(draft_name, 0) + 1
    if report.engine_version is None:
        try:
            report.engine_version = str(instance.version())
        except Exception as e:  # a version string must not cost the run
            report.engine_version = f"unknown ({type(e).__name__}: {e})"
    try:
        yield instance
    finally:
        try:
            state.engine_info[draft_name] = dict(instance.info())
        except Exception as e:  # what the engine says about itself must not cost the run
            state.engine_info[draft_name] = {"error": f"{type(e).__name__}: {e}"}
        try:  # a hung engine may not close either; the session goes on without it
            timeouts.call_with_deadline(instance.close, (), budget.base_s if budget.enabled else None,
                                        "close")
        except timeouts.EngineHang:
            pass


# -- outcomes --------------------------------------------------------------------------------
# Recorded from hooks that carry the item or collector, so the state is the config's own
# (pytester runs sessions inside a session; a module-level "current" would mix them up).


def _crash_failure(item: pytest.Item, exc: BaseException) -> BaseException | None:
    """The failure an EngineCrash out of a check stands for, diagnosed with the draft's ids;
    None for any other exception. (harness.engines.base not yet imported: no engine ran.)"""
    base = sys.modules.get("harness.engines.base")
    if base is None or not isinstance(exc, base.EngineCrash):
        return None
    from harness.judgement.assertions import crash_failure

    state = _state(item.config)
    draft = getattr(getattr(item, "callspec", None), "params", {}).get("draft_name")
    bundle = state.bundle()
    spec = bundle.draft(draft) if draft is not None else None
    engine = getattr(item, "funcargs", {}).get("engine")
    return crash_failure(exc, layer_ids=spec.layer_ids if spec else (),
                         target_hidden=bundle.hidden_size, engine_name=state.engine_name,
                         draft=draft or "<draft>",
                         engine_convention=getattr(engine, "convention", None),
                         training_boundaries=spec.boundaries if spec else None,
                         num_layers=bundle.num_layers,
                         pipeline_stages=getattr(engine, "pipeline_stages", None))


def _crashes_fail(item: pytest.Item) -> Generator[None, Any, Any]:
    """The body of a hook wrapper that re-raises an EngineCrash as its check's failure."""
    try:
        return (yield)
    except Exception as exc:
        failure = _crash_failure(item, exc)
        if failure is None:
            raise
        raise failure from exc


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    """An engine that crashes while it is built (a draft it cannot load) fails the check too."""
    return (yield from _crashes_fail(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    return (yield from _crashes_fail(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    collector = _state(item.config).collector
    record = collector.get(item.nodeid)
    collector.current = record.id if record else None
    try:
        return (yield)
    finally:
        collector.current = None


# tryfirst makes this the outermost wrapper: it sees the report after the xfail handling.
@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    record = _state(item.config).collector.get(item.nodeid)
    if record is None:
        return rep
    message = ""
    if call.excinfo is not None:
        message = exception_message(call.excinfo)
        # a failed check never carries kind "ok" (harness.diagnosis.record.failing_diagnoses),
        # whichever way its ConformanceFailure was raised
        for d in failing_diagnoses(getattr(root_failure(call.excinfo.value)[0], "diagnoses", None)
                                   or (), message):
            as_json = record.add_diagnosis(d)
            # junit.xml carries them too, as <property name="diagnosis">
            item.user_properties.append(("diagnosis",
                                         f"{as_json.get('kind')}: {as_json.get('message')}"))
    record.duration_s += rep.duration
    outcome = check_outcome(rep, message, record.xfail_reason)
    if outcome is not None:
        record.settle(*outcome)
    return rep


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    rep = yield
    if rep.failed and _KEY in collector.config.stash:
        nodeid = rep.nodeid or "<collection>"
        record = _state(collector.config).collector.check(check_id(nodeid), nodeid)
        record.settle("error", f"collection error: {rep.longreprtext.strip()}")
    return rep


# -- session end -----------------------------------------------------------------------------


def _interrupted(session: pytest.Session, exitstatus: int) -> str | None:
    if session.shouldfail:
        return str(session.shouldfail)
    if session.shouldstop:
        return str(session.shouldstop)
    if exitstatus == pytest.ExitCode.INTERRUPTED and not session.testsfailed:
        return "interrupted"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist, on the controller: a worker finished; fold its record into ours."""
    payload = getattr(node, "workeroutput", {}).get(distributed.PAYLOAD_KEY)
    if payload is None:
        return
    state = _state(node.config)
    state.from_workers = True
    distributed.merge_payload(state.collector, payload)
    state.conformance_run = state.conformance_run or payload["conformance_run"]
    state.engine_info.update(payload["engine_info"])
    state.unmatched_xfails = state.unmatched_xfails or payload["unmatched_xfails"]
    # every worker deselects the same checks: the most any reports, not their sum
    state.deselected = max(state.deselected, payload.get("deselected", 0))


# seconds the session waits, at its end, for the calls abandoned at their deadline to finish
# once their engines are closed (harness.run.timeouts.join_abandoned)
ABANDONED_WAIT_S = 30.0


@pytest.hookimpl(trylast=True)  # after junitxml has written its file
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from harness.run import timeouts

    # after Ctrl-C the user waits for nothing: what still runs is left to the CLI's exit
    timeouts.join_abandoned(0 if exitstatus == pytest.ExitCode.INTERRUPTED else ABANDONED_WAIT_S)
    state = _state(session.config)
    partial = state.junit_tmp
    if distributed.is_worker(session.config):  # the controller writes the one report
        session.config.workeroutput[distributed.PAYLOAD_KEY] = distributed.collector_payload(
            state.collector, conformance_run=state.conformance_run,
            engine_info=state.engine_info, unmatched_xfails=state.unmatched_xfails,
            deselected=state.deselected)
        return
    # no verdict: bad input, a suite bug, no check selected, or Ctrl-C (a partial run
    # certifies nothing, so it leaves no report either)
    bad_input = exitstatus in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERNAL_ERROR,
                               pytest.ExitCode.NO_TESTS_COLLECTED, pytest.ExitCode.INTERRUPTED)
    # --collect-only, --fixtures, --setup-plan...: no check ran, so there is no verdict either
    if bad_input or non_run_mode(session.config) or not (state.conformance_run or state.report_dir):
        if partial is not None:
            partial.unlink(missing_ok=True)
        return
    if not state.resolved:  # no check ran the engine; the report still names its class, dtype
        try:
            state.resolve()
        except pytest.UsageError:
            pass
    if state._bundle is None and state.from_workers:  # an xdist controller ran no check
        try:
            state.bundle()
        except pytest.UsageError:
            pass
    cls = state.engine_cls
    engine = {"name": state.engine_name, "version": state.collector.engine_version,
              "class": engine_path(cls) if cls else None,
              "capabilities": sorted(getattr(c, "value", str(c))
                                     for c in getattr(cls, "capabilities", ())),
              "convention": getattr(getattr(cls, "convention", None), "name",
                                    getattr(cls, "convention", None)),
              "constructions": dict(state.collector.engine_constructions),
              "info": dict(state.engine_info)}
    drafts = state.drafts() if state._bundle is not None else list(state.option("draft") or [])
    seed = session.config.getoption("hypothesis_seed", None)
    extra = {"hypothesis_profile": hypothesis_settings.get_current_profile_name(),
             "hypothesis_seed": None if seed is None else str(seed),
             "hypothesis_derandomize": bool(hypothesis_settings.default.derandomize),
             "selection": {"keyword": session.config.option.keyword or None,
                           "markexpr": session.config.option.markexpr or None,
                           "deselected": state.deselected},
             "xfails": {"file": str(state.xfails_path) if state.xfails_path else None,
                        "unmatched": state.unmatched_xfails},
             # each draft's acceptance as trained and under each wrong wiring (the manifest's,
             # measured when the bundle was built): report.html plots the engine against them
             "wirings": {d: (state._bundle.manifest["drafts"].get(d) or {}).get("wirings") or {}
                         for d in drafts} if state._bundle is not None else {},
             "options": {"device": state.option("device"),
                         "num_draft_tokens": state.option("num_draft_tokens")}}
    state.report = state.collector.build(
        engine=engine, bundle=state.bundle_json(), drafts=drafts, dtype=state.dtype(),
        started=state.started, finished=time.time(), interrupted=_interrupted(session, exitstatus),
        extra=extra)
    if state.report_dir is not None:
        if partial is not None and partial.is_file():
            os.replace(partial, state.report_dir / "junit.xml")
            _point_junit_summary_at(session.config, state.report_dir / "junit.xml")
        report = state.report
        write_reports(report, state.report_dir,
                      companions=lambda text: certificate_files(report, text))


def _point_junit_summary_at(config: pytest.Config, path: Path) -> None:
    """junitxml prints "generated xml file: <path>" after this; make it name the final file."""
    from _pytest.junitxml import xml_key

    logxml = config.stash.get(xml_key, None)
    if logxml is not None and hasattr(logxml, "logfile"):
        logxml.logfile = str(path)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None or state.report is None:
        return
    r = state.report
    terminalreporter.write_sep("=", "eagle3-conformance")
    terminalreporter.write_line(
        f"engine {r['engine']['name']} ({r['engine'].get('version') or 'version unknown'}), "
        f"bundle {r['bundle'].get('name')}, drafts {', '.join(r['drafts']) or '-'}, "
        f"dtype {r['dtype']}")
    if r["xfails"]["unmatched"]:
        terminalreporter.write_line(f"xfails lines that matched no check: "
                                    f"{'; '.join(r['xfails']['unmatched'])}")
    terminalreporter.write_line(verdict_line(r, state.report_dir))
