"""The commands beside `run`, and what only they use: `doctor` (one target and one draft on
disk, no bundle) with its three outcomes (`doctor_outcome`) and the boundaries a draft's
weights say it was trained on (`weight_inference`); `selftest` (the suite against the bug zoo,
each mutant caught and named); and `mutant_scan` (zoo mutants judged on one draft's pinned
batch without a suite run, for the diagnosis map and the precision tests).

They drive the run and the judgement; only the command line imports them."""
