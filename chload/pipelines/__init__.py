"""Pipelines files: `chload run chload.toml` runs the loads a TOML file declares
(file.py reads and checks it; run.py runs its loads, once or following). A layer over
the API: each load is one `chload.load` call, its options the function's parameters."""
