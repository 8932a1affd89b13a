"""Run plumbing: preflight checks, the checkpoint format, storage errors, run files, logging and stop signals, actor placement."""
