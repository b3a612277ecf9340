"""The vocabulary every layer speaks, importing nothing of the package: the boundary model
(`boundaries`: layer ids, conventions and the residual-stream coordinates every comparison uses),
the strict shapes of the two configs (`config_schema`), the table of numeric bounds per dtype
with their reasons (`tolerances`), and the speculation cost model (`throughput`: the
`StepCosts` an engine measures and the speedup they promise).

They sit at the bottom, not beside what uses them most, because engines, models and golden
import them: a tolerance or a boundary living in the judgement package would make the engine
layer reach up into it."""
