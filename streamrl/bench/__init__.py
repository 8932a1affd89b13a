"""Benchmarks and measurement tools: `streamrl bench` and what it runs, apart from the commands that train."""
