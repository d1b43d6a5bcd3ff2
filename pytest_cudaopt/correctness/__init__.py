"""The correctness verdict: is ModelNew the same function as Model, on many shapes, through every guard.

What it offers: `verdict.judge_canonical` / `verdict.judge_drawn` (one item each, its result
recorded), `shapes` (the drawn-shape strategies; `derived`: the constants model.py computes from
others, which follow the drawn ones), `state` (parameters and running statistics
moved from their defaults, and which one a candidate ignores), `case.run_case` (one case: its
models and inputs, then `guards.run_case`, through every guard), `compare.compare_outputs` (the element-wise comparison and its table), `precision`
(relative L2 error against float64 and the tier it names), the op audit (worker.observe: the ATen ops that
ModelNew.forward dispatches) and `faults` (CUDA errors that lose the context).
Nothing here imports the speed verdict (perf/)."""
