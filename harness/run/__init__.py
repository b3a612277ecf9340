"""Running the suite: the pytest plugin (`plugin`, entry point `eagle3_conformance`) and one
run's state (`session`); the run options, their validation and the input checks shared with
the command line (`options`, `run_inputs`); engine lookup (`registry`); the bundle gate before
any check (`bundle_gate`); the Hypothesis profiles and strategies the suites draw from
(`profiles`, `strategies`); known-nonconformance files (`xfails`); deadlines on engine calls
(`timeouts`); the pytest modes that run no check (`pytest_modes`); and one report from many
pytest-xdist workers (`distributed`).

It calls the judgement and writes the report; only the tools and the command line import it."""
