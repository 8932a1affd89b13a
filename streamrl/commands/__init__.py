"""The `streamrl` command line and its tools (launch, eval, plots, reproduce, uplift, difficulty); the benchmarks
are `streamrl.bench`.

Commands sit above the processes: they may import `actors` and `learner` (to start them in-process or
as children), while those two and the rest of `streamrl/` never import from here (the benchmarks alone do: they
drive the launcher).
"""
