"""`eagle3-conformance doctor`: one target and one draft on disk, no golden bundle.

Lints the draft config against the target's, computes the training-time reference on the fly
(fp32 transformers target through the residual recorder, on prompts the target continues
greedily), infers from the draft's weights which boundaries it was trained on
(harness.weight_inference), captures what the engine feeds the draft, diagnoses it
(harness.diagnosis.capture), and re-serves the draft with the ids the diagnosis suggests to
verify the fix (worded by harness.observed_convention.fix_result, as the layer-id check does).
Writes the same report files as a suite run.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

NESTED, TOP_LEVEL = "specforge-nested", "speculators-top-level"
IDS = "eagle_aux_hidden_state_layer_ids"
SEED_LEN, NEW_TOKENS, NUM_PROMPTS = 8, 16, 8
# with --prompts (text of the draft's own training distribution): tokens the target continues
# each prompt by, all scored (24 prompts x 32 tokens name 3 of the 4 bundle drafts' layers)
PROMPT_NEW_TOKENS = 32


class DoctorError(ValueError):
    """Bad input: one line naming the problem and the fix."""


def config_layout(cfg: Any, path: Path) -> tuple[str, list[int]]:
    """(layout, ids) of a draft config: SpecForge/SGLang nest the ids in `eagle_config`,
    speculators puts them at the top level beside `speculators_model_type`."""
    if not isinstance(cfg, dict):
        raise DoctorError(f"{path} is not a JSON object; pass the draft's config.json")
    if isinstance(cfg.get("eagle_config"), dict) and IDS in cfg["eagle_config"]:
        layout, ids = NESTED, cfg["eagle_config"][IDS]
    elif "speculators_model_type" in cfg and IDS in cfg:
        layout, ids = TOP_LEVEL, cfg[IDS]
    else:
        raise DoctorError(f"{path} is neither a SpecForge/SGLang draft config (eagle_config."
                          f"{IDS}) nor a speculators one (speculators_model_type with a top-level "
                          f"{IDS}); export the draft in one of these layouts")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
        raise DoctorError(f"{path}: {IDS} must be a non-empty list of ints, got {ids!r}")
    return layout, list(ids)


def _read_json(path: Path, what: str) -> Any:
    if not path.is_file():
        raise DoctorError(f"{path} not found; pass the {what} folder (with config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DoctorError(f"{path} is not valid JSON ({e}); re-export the {what}") from None


def with_ids(draft_dir: Path, ids: Sequence[int], layout: str, scratch: Path) -> Path:
    """A copy of the draft folder whose config lists `ids` where `layout` keeps them (same
    weights: a fix is a config change)."""
    out = scratch / ("ids_" + "_".join(str(i).replace("-", "m") for i in ids))
    shutil.copytree(draft_dir, out, dirs_exist_ok=True)
    cfg = json.loads((draft_dir / "config.json").read_text())
    if layout == NESTED:
        cfg["eagle_config"][IDS] = list(ids)
    else:
        cfg[IDS] = list(ids)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def _capture(engine_cls: type, target: Path, draft: Path, options: Any,
             prompts: list[list[int]]) -> tuple[list[Any] | None, str | None]:
    from harness.engines.base import EngineCrash, EngineUnavailable

    engine = None
    try:
        engine = engine_cls(target, draft, options)
        return engine.capture(prompts).features, None
    except (EngineCrash, EngineUnavailable) as e:
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__
    finally:
        if engine is not None:
            engine.close()


def read_prompts(path: Path, vocab_size: int) -> list[list[int]]:
    """`--prompts`: a JSON list of token-id lists (text of the draft's training distribution),
    cut to the shortest one's length so every prompt is scored from the same position."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DoctorError(f"--prompts {path}: cannot read it as JSON ({type(e).__name__}); pass a "
                          f"file holding a list of token-id lists") from None
    if (not isinstance(rows, list) or not rows
            or not all(isinstance(r, list) and r and all(isinstance(t, int) and not isinstance(t, bool)
                                                         for t in r) for r in rows)):
        raise DoctorError(f"--prompts {path}: expected a non-empty JSON list of non-empty lists of "
                          f"token ids, e.g. [[12, 7, 99], [4, 5, 6]]")
    bad = sorted({t for r in rows for t in r if not 0 <= t < vocab_size})
    if bad:
        raise DoctorError(f"--prompts {path}: token ids {bad[:5]} are outside the target's vocabulary "
                          f"(0..{vocab_size - 1}); tokenize with the target's tokenizer")
    length = min(len(r) for r in rows)
    return [r[:length] for r in rows]


def run_doctor(target: Path, draft: Path, engine_name: str, convention: str | None,
               device: str, dtype: str | None, report_dir: Path | None,
               say: Callable[[str], None] = print, prompts_file: Path | None = None) -> int:
    """The doctor; returns the exit code (0 the engine feeds the draft as trained, 1 not)."""
    import torch
    from safetensors.torch import load_file

    from harness.assertions import ConformanceFailure, assert_capture_matches
    from harness.boundaries import CONVENTIONS, LayerIdError, ids_to_boundaries, short_boundary
    from harness.config_schema import target_config_problems
    from harness.diagnosis.crash import crash_diagnosis
    from harness.engines.base import EngineOptions
    from harness.golden.envelope import EnvelopeBuilder
    from harness.golden.features import target_features
    from harness.lint import lint_draft
    from harness.models.draft import Eagle3Draft
    from harness.models.target import load_target
    from harness.observed_convention import Observation, fix_result, literal_ids
    from harness.registry import resolve_engine
    from harness.report import ReportCollector, verdict_line, write_reports
    from harness.tolerances import tolerance_for
    from harness.weight_inference import greedy_prompts, infer_boundaries

    started = time.time()
    target, draft = Path(target), Path(draft)
    tcfg = _read_json(target / "config.json", "target")
    problems = target_config_problems(tcfg)
    if problems:
        raise DoctorError(f"target config: {problems[0][0]}: {problems[0][1]}")
    dcfg = _read_json(draft / "config.json", "draft")
    layout, ids = config_layout(dcfg, draft / "config.json")
    if convention is not None and convention not in CONVENTIONS:
        raise DoctorError(f"unknown convention {convention!r}; use one of {sorted(CONVENTIONS)}")
    engine_cls = resolve_engine(engine_name)
    n = int(tcfg["num_hidden_layers"])
    say(f"target {target}: {n} layers, hidden {tcfg['hidden_size']}; draft {draft}: {layout} "
        f"layout, ids {ids}")
    if layout == NESTED:
        for p in lint_draft(draft, tcfg, convention or "specforge"):
            say(f"lint: {p}")

    if prompts_file is not None:
        seeds, new_tokens = read_prompts(prompts_file, int(tcfg["vocab_size"])), PROMPT_NEW_TOKENS
        what = f"{len(seeds)} prompts of {prompts_file} ({len(seeds[0])} tokens each)"
    else:
        gen = torch.Generator().manual_seed(0)
        seeds = [torch.randint(3, int(tcfg["vocab_size"]), (SEED_LEN,), generator=gen).tolist()
                 for _ in range(NUM_PROMPTS)]
        new_tokens, what = NEW_TOKENS, f"{NUM_PROMPTS} random-token prompts"
    say(f"[1/4] training-time reference: fp32 target on {device}, {what} continued {new_tokens} "
        f"tokens by the target ...")
    model = load_target(target, torch.float32, device)
    prompts = greedy_prompts(model, seeds, new_tokens)
    feats = [target_features(model, p) for p in prompts]

    say("[2/4] inferring the trained boundaries from the draft's weights ...")
    dmodel = Eagle3Draft.load(draft, torch.float32, device)
    if "embed_tokens.weight" not in load_file(str(draft / "model.safetensors")):
        dmodel.embed_tokens.weight.data.copy_(model.model.embed_tokens.weight.data)
    inference = infer_boundaries(dmodel, prompts, feats, score_from=len(seeds[0]), progress=say)
    say(inference.line())
    told: list[int] | None = None
    if convention is not None:
        try:
            told = list(ids_to_boundaries(ids, convention, n))
        except LayerIdError as e:
            say(f"the config's ids {ids} mean nothing under {convention}: {e}")
    if not inference.ambiguous:
        trained, source = inference.boundaries, "inferred from the weights"
        if told is not None and told != trained:
            say(f"the config's ids {ids} read as {convention} mean boundaries {told}, but the "
                f"weights say training used {trained}: the config was written wrong")
    elif told is not None:
        trained, source = told, f"the config's ids read as {convention}"
    else:
        raise DoctorError("the weights do not tell which boundaries training used (ambiguous) and "
                          "no --convention was given; pass --convention NAME (the trainer's)")
    say(f"trained on: boundaries {trained} "
        f"({', '.join(short_boundary(b, n) for b in trained)}) — {source}")

    options = EngineOptions(dtype=dtype or engine_cls.default_dtype, device=device,
                            training_convention=convention)
    engine_conv = engine_cls.convention or convention
    # the suite's own judgement, for the capture and for the re-served fix alike: fp32 strict;
    # reduced precision against the precision envelope of the target itself in the engine's
    # dtype (a fixed rtol cries wolf there: the decorrelated bundle target's layers partly
    # cancel their input, and a verified fix would read as "fix fails")
    envelopes = None
    if not tolerance_for(options.dtype).strict:
        builder = EnvelopeBuilder(target, model)
        envelopes = [builder.envelope(p, options.dtype) for p in prompts]
        del builder

    def judge(captured: Sequence[torch.Tensor], config_ids: Sequence[int], check: str) -> Any:
        try:
            return assert_capture_matches(
                features=captured, golden=feats, training_boundaries=trained, dtype=options.dtype,
                engine_name=engine_name, engine_convention=engine_conv, config_ids=config_ids,
                draft=draft.name, prompts=prompts, check=check, envelopes=envelopes)
        except ConformanceFailure as failure:
            return failure.diagnoses[0]

    say(f"[3/4] capturing through {engine_name} ({options.dtype}, {device}) ...")
    features, crash = _capture(engine_cls, target, draft, options, prompts)
    if crash is not None:
        diag = crash_diagnosis(crash, ids, int(tcfg["hidden_size"]), engine_convention=engine_conv,
                               training_boundaries=trained, num_layers=n)
        fed: list[Any] = []
    else:
        diag = judge(features, ids, "doctor::capture")
        fed = diag.engine_boundaries
    say(f"fed: {fed if crash is None else 'nothing (the engine crashed)'}; trained: {trained}")
    say(f"diagnosis: {diag.kind}: {diag.message}")

    collector = ReportCollector()
    check = collector.check("doctor::capture", "doctor::capture", draft.name, True)
    check.add_diagnosis(diag)
    check.settle("passed" if diag.kind == "ok" else "failed", "" if diag.kind == "ok" else diag.message)
    if crash is None:
        collector.observe(Observation(layout, tuple(ids), n, slots=tuple(fed)))
    fix_ok = diag.kind == "ok"
    if diag.kind != "ok":
        fix_ids = diag.suggested_layer_ids
        suggested = bool(fix_ids)
        no_ids = ""
        if not suggested and engine_conv is not None:
            try:
                fix_ids = list(literal_ids(trained, engine_conv, n))
            except LayerIdError as e:
                no_ids = f"no id list to re-serve: {e}"
        if no_ids:
            say(f"fix: {no_ids}")
        elif fix_ids:
            say(f"[4/4] re-serving with {IDS} = {list(fix_ids)} ({layout}) to verify the fix ...")
            with tempfile.TemporaryDirectory(prefix="eagle3-doctor-") as scratch:
                fixed = with_ids(draft, fix_ids, layout, Path(scratch))
                f2, crash2 = _capture(engine_cls, target, fixed, options, prompts)
            slots = (None if f2 is None
                     else list(judge(f2, fix_ids, "doctor::fix").engine_boundaries))
            text, holds = fix_result(fix_ids, layout, trained, suggested, slots, crash2)
            fix_ok = holds and suggested
            collector.fix(draft.name, {"ids": list(fix_ids), "layout": layout, "suggested": suggested,
                                       "diagnosis_kind": diag.kind, "result": text})
            collector.observe(Observation(layout, tuple(fix_ids), n,
                                          slots=None if slots is None else tuple(slots), crash=crash2))
            say(f"fix: {text}")
        else:
            say("fix: no id list to re-serve (the engine declares no layer-id convention; pass "
                "--convention)")
    report = collector.build(engine={"name": engine_name, "convention": engine_conv},
                             bundle={"name": None, "path": None}, drafts=[draft.name],
                             dtype=options.dtype, started=started, finished=time.time(),
                             extra={"doctor": {"target": str(target), "draft": str(draft),
                                               "layout": layout, "config_ids": ids,
                                               "trained_boundaries": trained,
                                               "trained_source": source,
                                               "fed_boundaries": fed,
                                               "inference": inference.to_json(),
                                               "fix_verified": fix_ok}})
    if report_dir is not None:
        write_reports(report, Path(report_dir))
        say(f"report: {Path(report_dir) / 'report.html'}")
    say(verdict_line(report))
    return 0 if diag.kind == "ok" else 1
