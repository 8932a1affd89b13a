"""The `streamrl` command line and its tools (launch, bench, eval, plots, reproduce, uplift, difficulty).

Commands sit above the processes: they may import `actors` and `learner` (to start them in-process or
as children), while those two and the rest of `streamrl/` never import from here.
"""
