"""The speed verdict: the custom path against eager and torch.compile, timed side by side by one engine, then gated.

What it offers: `verdict.judge` (one perf item: line-up, timing, trace, gate), `engine.measure`
(the interleaved timing engine), `feed` (a fresh input set for every timed call), `clocks` (CUDA events, perf_counter, a fake for tests, and the
timing functions bound before any workdir code runs), `runs` (what a clock times; the candidate's
calls timed in batches through its Candidate Protocol), `stats` (medians, IQR, the stop rule's
standard error), `trace` (the kernel trace of one call and stream escapes), `lineup` (the
contenders and their keys) and `gate` (the gate's and the regression check's decisions)."""
