"""What decides pass or fail, in one place: a check's verdict (`verdict`: `Judgement`, the
measure, its bound, why, the diagnosis computed once; `fail`), the checks' judge functions
(`assertions`: the capture, fc, decode, generation, layer-id, canary and throughput
judgements, each against its bound in `harness.core.tolerances`), the one branch between fp32
and reduced precision (`precision`), the acceptance arithmetic, its judgements and the
explanation of a shortfall (`acceptance`), non-finite values found before anything is compared
(`finite`), and the draft
lint (`lint`: what is wrong with a draft folder before any engine runs; the draft-config
concern's judgement and the gate on every bundle a command loads).

It asks the diagnosis why and raises the report's `ConformanceFailure`; the run, the tools and
the command line call it, never the other way round. This package's own import is empty, so
`harness.judgement.lint` loads no assertion."""
