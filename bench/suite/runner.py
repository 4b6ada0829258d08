"""Runs the methods over the datasets: interleaved, repeated, timed, verified, bounded.

For each case (one dataset in one format) every applicable method runs `warmup`
unmeasured rounds then `repeats` measured ones, the order reversed every other round
so that a noisy neighbour hits all methods alike. Each run is a fresh process writing
to a fresh place (a new chDB directory, a new server table); after it the rows are
counted (chload's independently of chload, server tables with `count()`), and a run
that loaded a wrong number of rows is a failure, not a figure.

The suite is bounded: past the profile's time budget no new run starts, and what was
not measured is reported as skipped. A method that fails stops being run for that case.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from suite.datasets import Dataset
from suite.methods import Env, Method, Slot, server_ddl
from suite.monitor import Monitor, Usage

COUNT_EMBEDDED = ("import sys, chdb.session; s = chdb.session.Session(sys.argv[1]); "
                  "print(s.query('SELECT count() FROM t', 'TSV').bytes().decode().strip())")


@dataclass
class Case:
    dataset: Dataset
    methods: list[Method]


@dataclass
class Outcome:
    """Every run of one method on one case."""

    method: Method
    dataset: Dataset
    seconds: list[float] = field(default_factory=list)
    usages: list[Usage] = field(default_factory=list)
    rows: int = 0
    status: str = "ok"  # ok | failed | not available | skipped
    note: str = ""
    command: str = ""
    costs: list[dict] = field(default_factory=list)  # chload's LoadReport.costs per run


class Server:
    """What the runner needs of the ClickHouse server: SQL over HTTP and its PID."""

    def __init__(self, query: Callable[[str], str], pid: int) -> None:
        self.query, self.pid = query, pid


class Runner:
    def __init__(self, env: Env, work: str, server: Server | None, deadline: float,
                 log: Callable[[str], None]) -> None:
        self.env, self.work, self.server, self.deadline, self.log = (
            env, work, server, deadline, log)
        self._ids = itertools.count(1)
        from chload.runtime.monitor import device_of

        self.device = device_of(work)

    # -- one run ------------------------------------------------------------------------
    def _slot(self, method: Method, ds: Dataset) -> Slot:
        n = next(self._ids)
        if method.target == "embedded":
            return Slot(ds, directory=os.path.join(self.work, f"run{n}"))
        assert self.server is not None
        table = f"{self.env.database}.r{n}"
        if not method.creates_table:
            self.server.query(server_ddl(ds, table, method.audit))
        return Slot(ds, table=table)

    def _count(self, method: Method, slot: Slot, stdout: str) -> int:
        if method.target == "server":
            assert self.server is not None
            return int(self.server.query(f"SELECT count() FROM {slot.table}").strip())
        if not (method.chload or method.name.startswith("chload @")):
            # engine_sql.py prints count() of its own table
            return int(stdout.strip().splitlines()[-1])
        done = subprocess.run([self.env.python, "-c", COUNT_EMBEDDED, slot.directory],
                              capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"counting rows failed: {done.stderr.strip()[-300:]}")
        return int(done.stdout.strip())

    def _cleanup(self, slot: Slot) -> None:
        if slot.directory:
            shutil.rmtree(slot.directory, ignore_errors=True)
        elif self.server is not None:
            self.server.query(f"DROP TABLE IF EXISTS {slot.table}")

    def run_once(self, method: Method, ds: Dataset) -> tuple[float, Usage, int, list[str], str]:
        """Time one run; raise RuntimeError when it fails or loads the wrong rows."""
        slot = self._slot(method, ds)
        argv = method.command(self.env, slot)
        try:
            monitor = Monitor(self.device, self.server.pid if self.server else None).start()
            started = time.perf_counter()
            code, out, err = _run(argv, self.work, max(5.0, self.deadline - time.monotonic()))
            seconds = time.perf_counter() - started
            usage = monitor.stop()
            if code != 0:
                raise RuntimeError(f"exit {code}: {_last_lines(err or out)}")
            rows = self._count(method, slot, out)
        finally:
            self._cleanup(slot)
        if rows != ds.rows:
            raise RuntimeError(f"loaded {rows:,} rows, expected {ds.rows:,}")
        return seconds, usage, rows, argv, out

    # -- one case -----------------------------------------------------------------------
    def run_case(self, case: Case, warmup: int, repeats: int,
                 unavailable: dict[str, str]) -> list[Outcome]:
        ds = case.dataset
        outcomes = {m.key: Outcome(m, ds) for m in case.methods}
        for key, why in unavailable.items():
            if key in outcomes:
                outcomes[key].status, outcomes[key].note = "not available", why
        live = [m for m in case.methods if outcomes[m.key].status == "ok"]
        for round_ in range(warmup + repeats):
            order = live[::-1] if round_ % 2 else live
            for method in order:
                outcome = outcomes[method.key]
                if outcome.status != "ok":
                    continue
                if time.monotonic() > self.deadline:
                    self.log(f"time budget spent: {ds.label} {method.key} not run")
                    return self._finish(outcomes, budget_spent=True)
                self._one(outcome, measured=round_ >= warmup, label=f"round {round_ + 1}")
        return self._finish(outcomes, budget_spent=False)

    def _one(self, outcome: Outcome, measured: bool, label: str) -> None:
        method, ds = outcome.method, outcome.dataset
        try:
            seconds, usage, rows, argv, out = self.run_once(method, ds)
        except (RuntimeError, OSError, ValueError) as exc:
            # One failed run fails the method: no figure from its other runs.
            outcome.status, outcome.note = "failed", f"{label}: {exc}"
            self.log(f"{ds.label:<18} {method.key:<52} FAILED {exc}")
            return
        outcome.command = _show(argv)
        outcome.rows = rows
        if measured:
            outcome.seconds.append(seconds)
            outcome.usages.append(usage)
            if method.chload or method.name.startswith("chload @"):
                outcome.costs.append(costs_of(out, seconds))
        tag = label if measured else "warm-up"
        self.log(f"{ds.label:<18} {method.key:<52} {seconds:7.2f} s  "
                 f"{rows / seconds:>12,.0f} rows/s  ({tag})")

    @staticmethod
    def _finish(outcomes: dict[str, Outcome], budget_spent: bool) -> list[Outcome]:
        for outcome in outcomes.values():
            if outcome.status == "ok" and not outcome.seconds:
                outcome.status = "skipped"
                outcome.note = "time budget spent before it was measured" if budget_spent \
                    else "not measured"
        return list(outcomes.values())


def _run(argv: list[str], cwd: str, timeout: float) -> tuple[int, str, str]:
    """Run a command in its own process group; on timeout kill that group."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return -9, out, f"timed out after {timeout:.0f} s (time budget)\n{err}"
    return proc.returncode, out, err


def _last_lines(text: str, n: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-600:]


def _show(argv: list[str]) -> str:
    """The command, shortened: long file lists collapse to their count."""
    head = ["python"] if argv[0] == sys.executable else [argv[0]]
    files = [a for a in argv[1:] if os.path.isfile(a) and not a.endswith(".py")]
    text = " ".join(head + [a for a in argv[1:] if a not in files])
    return text + (f" <{len(files)} files>" if files else "")


def costs_of(stdout: str, seconds: float | None = None) -> dict:
    """The fixed and per-unit costs chload reports about its own run (`--json`:
    LoadReport.costs; empty where the commit measured does not report them), with
    `beyond_data_s`: the run's whole time (`seconds`, as the bench timed it) less the span
    of its data requests (`data_s`), i.e. what a load of no rows would still cost."""
    lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
    try:
        costs = json.loads(lines[-1]).get("costs") if lines else None
    except ValueError:
        return {}
    if not isinstance(costs, dict):
        return {}
    if seconds is not None and isinstance(costs.get("data_s"), (int, float)):
        costs["beyond_data_s"] = round(seconds - costs["data_s"], 3)
    return costs


def _median_costs(costs: list[dict]) -> dict:
    keys = {k for c in costs for k, v in c.items() if isinstance(v, (int, float))}
    return {k: round(statistics.median(c[k] for c in costs if c.get(k) is not None), 4)
            for k in sorted(keys) if any(c.get(k) is not None for c in costs)}


def summarize(outcome: Outcome) -> dict:
    """One result object of results.json (ratio_vs_chload is filled in afterwards)."""
    ds, m = outcome.dataset, outcome.method
    ok = outcome.status == "ok" and outcome.seconds
    median = statistics.median(outcome.seconds) if ok else None
    size = ds.size_bytes()
    result = {
        "method": m.name, "target": m.target, "dataset": ds.name, "format": ds.ext,
        "mode": m.mode, "audit": m.audit, "chload": m.chload, "status": outcome.status,
        "rows": ds.rows, "files": ds.files, "bytes": size,
        "seconds": round(median, 6) if median else None,  # rows_per_s agrees to 1e-4
        "rows_per_s": round(ds.rows / median) if median else None,
        "mb_per_s": round(size / median / 1e6, 2) if median else None,
        "ratio_vs_chload": None, "baseline": None,
        "runs": [round(s, 6) for s in outcome.seconds],
        "note": outcome.note, "command": outcome.command, "about": m.about,
        "costs": _median_costs(outcome.costs) if ok else {},
    }
    result.update(_mean_usage(outcome.usages if ok else []))
    return result


def _mean_usage(usages: list[Usage]) -> dict:
    keys = [k for k in asdict(Usage()) if k != "disk"]
    out: dict[str, object] = {"disk": next((u.disk for u in usages if u.disk), None)}
    for key in keys:
        values = [getattr(u, key) for u in usages if getattr(u, key) is not None]
        out[key] = round(statistics.fmean(values), 2) if values else None
    return out


def add_ratios(results: list[dict]) -> None:
    """ratio_vs_chload = seconds / seconds of the chload variant on the same target and
    dataset (chload --audit for methods that add audit columns): above 1, chload is
    faster. None when that chload variant has no figure."""
    chload = {(r["target"], r["dataset"], r["format"], r["audit"]): r for r in results
              if r["chload"] and r["seconds"]}
    for r in results:
        base = chload.get((r["target"], r["dataset"], r["format"], r["audit"]))
        if base is None and r["chload"]:
            continue
        if base is None:
            r["baseline"] = f"{'chload --audit' if r['audit'] else 'chload'} [{r['target']}]"
            continue
        r["baseline"] = f"{base['method']} [{base['target']}]"
        if r["seconds"]:
            r["ratio_vs_chload"] = round(r["seconds"] / base["seconds"], 3)
