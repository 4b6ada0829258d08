"""The benchmark suite behind `scripts/bench`: datasets, methods, runner, /proc monitor
and report writers. See main.py for the command and docs/benchmarks.md for results."""
