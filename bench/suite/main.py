"""`scripts/bench`: the classic ClickHouse import methods side by side with chload.

    scripts/bench [--quick | --tiny | --large] [--out DIR] [--cache DIR] [--repeats N]
                  [--budget SECONDS] [--parallel N] [--only TEXT] [--data TEXT]

Generates the datasets (cached), starts a ClickHouse 18.16 server on 127.0.0.1 (stopped
by PID at the end), runs every method on every dataset it can take, and writes
results.json, results.md, results.png and machine.json to --out. Every figure comes
from this run; chload variants that cannot run yet (e.g. a target not built) are
reported as "not available", never estimated.

Profiles: full (default; about 20 minutes on 2 cores, bounded by --budget), --quick
(small sizes, under 10 minutes including data generation), --tiny (for the test),
--large (50M rows per dataset, where steady-state throughput decides, not fixed costs;
about an hour on 2 cores, plus generating ~6 GB of data once).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from suite import report
from suite.datasets import Dataset, ensure
from suite.methods import Env, Method, all_methods, vs_methods
from suite.runner import Case, Runner, Server, add_ratios, summarize

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "services"))

import services  # noqa: E402


@dataclass(frozen=True)
class CaseSpec:
    dataset: str
    ext: str
    rows: int
    files: int
    audit: bool = False  # also run the methods that add audit columns
    server: str = "all"  # which server methods: all | light | lean (see SERVER_SETS)


@dataclass(frozen=True)
class Profile:
    name: str
    repeats: int
    warmup: int
    budget_s: float  # from the start of the process, generation included
    cases: tuple[CaseSpec, ...]


def _trips(rows: int, files: int, server: str = "all") -> tuple[CaseSpec, ...]:
    light = "light" if server == "all" else server
    return (CaseSpec("trips", "csv.gz", rows, files, server=server),
            CaseSpec("trips", "parquet", rows, files, server=server),
            CaseSpec("trips", "jsonl.gz", rows, files, server=server),
            CaseSpec("trips", "csv", rows, files, server=light),
            CaseSpec("trips", "jsonl", rows, files, server=light))


PROFILES = {
    "tiny": Profile("tiny", repeats=1, warmup=0, budget_s=150, cases=(
        CaseSpec("trips", "csv.gz", 40_000, 2),
        CaseSpec("streams", "jsonl.gz", 10_000, 4, audit=True))),
    "quick": Profile("quick", repeats=2, warmup=1, budget_s=540, cases=(
        CaseSpec("streams", "jsonl.gz", 200_000, 50, audit=True),
        *_trips(1_000_000, 8),
        CaseSpec("taxi", "csv.gz", 100_000, 4), CaseSpec("taxi", "parquet", 100_000, 4))),
    "full": Profile("full", repeats=3, warmup=1, budget_s=1440, cases=(
        CaseSpec("streams", "jsonl.gz", 600_000, 200, audit=True),
        *_trips(4_000_000, 16),
        CaseSpec("taxi", "csv.gz", 500_000, 10), CaseSpec("taxi", "parquet", 500_000, 10))),
    # 50M rows per dataset. Only the server methods that were ever the fastest at the
    # smaller sizes run ("lean"; for streams only chDB's push ever was, "push"): a
    # sequential curl of 50M streams rows would take 15 minutes and decide nothing.
    # Taxi (150 wide columns) is left out: 50M rows would be ~5 GB of gzip CSV and ~4
    # minutes per method; bench/memory.py covers big, wide files.
    "large": Profile("large", repeats=2, warmup=0, budget_s=5400, cases=(
        *_trips(50_000_000, 50, server="lean"),
        CaseSpec("streams", "jsonl.gz", 50_000_000, 500, server="push"))),
}
# Server methods of a "light" or "lean" case: names, or name prefixes ending in ", ".
SERVER_SETS = {
    "light": ("chload", "chload --audit", "chDB SQL push (Native)", "curl POST, "),
    "lean": ("chload", "chload --audit", "chDB SQL push (Native)", "curl POST, parallel "),
    "push": ("chload", "chload --audit", "chDB SQL push (Native)"),
}


def _log(message: str) -> None:
    stamp = time.strftime("%H:%M:%S")
    print(f"[bench {stamp}] {message}", file=sys.stderr, flush=True)


def _applies(method: Method, spec: CaseSpec) -> bool:
    if spec.ext not in method.exts or (method.audit and not spec.audit):
        return False
    if method.target == "embedded" or spec.server == "all" or method.name.startswith("chload @"):
        return True
    return any(method.name == name or (name.endswith(" ") and method.name.startswith(name))
               for name in SERVER_SETS[spec.server])


def select(methods: list[Method], only: str | None) -> list[Method]:
    """The methods `--only TEXT` runs: those whose key contains TEXT, and with them every
    chload variant on their targets, the measured one (the baseline of every ratio) and
    `--chload-vs`'s (the A/B), so `--only 'chload [server]' --chload-vs REV` runs both
    commits into the server and nothing into the embedded engine."""
    if not only:
        return methods
    targets = {m.target for m in methods if only in m.key}
    return [m for m in methods if only in m.key
            or (m.target in targets and (m.chload or m.name.startswith("chload @")))]


def probe_chload_server(env: Env, work: str, server: Server) -> str | None:
    """None when `chload load --target http://...` loads a 3-row file into the server;
    else why not (the first line chload printed)."""
    path = os.path.join(work, "probe.csv")
    with open(path, "w") as fh:
        fh.write("id,name\n1,a\n2,b\n3,c\n")
    target = f"{env.server_url}/{env.database}"
    argv = [env.python, "-m", "chload", "load", path, "--table", "chload_probe", "--target",
            target, "--quiet"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=work)
    except subprocess.TimeoutExpired:
        return "chload load --target http://... did not finish within 120 s"
    lines = (done.stderr or done.stdout).strip().splitlines()
    if done.returncode:
        return f"chload load --target http://... exits {done.returncode}: " + \
            (lines[-1] if lines else "(no message)")
    try:
        got = int(server.query(f"SELECT count() FROM {env.database}.chload_probe").strip())
    except (RuntimeError, ValueError) as exc:
        return f"chload load --target http://... exits 0 but the table is not there: {exc}"
    return None if got == 3 else f"chload load --target http://... loaded {got} of 3 rows"


def machine(profile: Profile, server_version: str, work: str, device: str | None,
            source: str) -> dict:
    import chdb

    def read(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError:
            return ""

    cpu = next((line.split(":", 1)[1].strip() for line in read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor())
    mem_kb = next((int(line.split()[1]) for line in read("/proc/meminfo").splitlines()
                   if line.startswith("MemTotal")), 0)
    sectors = read(f"/sys/block/{device}/size").strip() if device else ""
    rotational = read(f"/sys/block/{device}/queue/rotational").strip() if device else ""
    disk = (f"{device} ({int(sectors) * 512 / 1e9:,.0f} GB, rotational={rotational} in /sys)"
            if sectors else str(device))
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--", "chload") if source == "worktree" else ""
    return {
        "profile": profile.name,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_kb / 2**20, 1),
        "kernel": platform.release(), "os": _os_name(), "disk": disk,
        "python": platform.python_version(), "chdb": chdb.__version__,
        "chdb_engine": chdb.query("SELECT version()", "TSV").bytes().decode().strip(),
        "server_version": server_version,
        "chload_commit": commit + (" (+ uncommitted changes in chload/)" if dirty else ""),
        "chload_source": source,
        "repeats": profile.repeats, "warmup": profile.warmup,
        "loadavg_start": " ".join(read("/proc/loadavg").split()[:3]), "work_dir": work,
    }


def _os_name() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip('"')
    return platform.system()


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    return done.stdout.strip()


def snapshot_chload(work: str, source: str, name: str = "chload-src") -> str:
    """Copy the chload package to measure (HEAD's, the working tree's, or another
    revision's) into `work` and return the directory to put first on PYTHONPATH."""
    dest = os.path.join(work, name)
    os.makedirs(dest)
    if source == "worktree":
        shutil.copytree(ROOT / "chload", os.path.join(dest, "chload"),
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        rev = "HEAD" if source == "head" else source
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "chload"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    # Bytecode, as `pip install` writes it: where PYTHONDONTWRITEBYTECODE is set, a
    # copy without it is compiled again by every timed process (60-90 ms here).
    subprocess.run([sys.executable, "-m", "compileall", "-q", dest], check=True)
    return dest


def _vs_methods(rev: str | None, work: str) -> list[Method]:
    if not rev:
        return []
    label = _git("rev-parse", "--short", rev) or rev
    return vs_methods(label, snapshot_chload(work, rev, "chload-vs"))


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, < 10 minutes")
    size.add_argument("--tiny", action="store_true", help="smallest sizes, for the test")
    size.add_argument("--large", action="store_true", help="50M rows per dataset, about an "
                      "hour on 2 cores (steady-state throughput)")
    parser.add_argument("--out", help="where the results go (default: bench/results for a "
                        "full run, /tmp/chload-bench-PROFILE otherwise)")
    parser.add_argument("--cache", default=os.environ.get(
        "CHLOAD_BENCH_CACHE", os.path.expanduser("~/.cache/chload/bench")),
        help="where generated datasets are kept (default ~/.cache/chload/bench)")
    parser.add_argument("--repeats", type=int, help="measured runs per method and dataset")
    parser.add_argument("--budget", type=float, help="stop starting runs after this many "
                        "seconds (default: the profile's)")
    parser.add_argument("--parallel", type=int, default=max(4, 2 * (os.cpu_count() or 1)),
                        help="clients of the 'parallel' variants (default 2 x cores, min 4)")
    parser.add_argument("--chload", choices=["head", "worktree"], default="head",
                        help="which chload to measure: the last commit (default) or the "
                        "working tree as it is at the start; either is copied first, so "
                        "edits made during the run do not change what is measured")
    parser.add_argument("--chload-vs", metavar="REV", help="also measure chload at this "
                        "git revision (methods 'chload @REV'), alternating with the measured "
                        "one: its 'vs chload' is the A/B of the two commits in one run")
    parser.add_argument("--only", help="run only the methods whose name [target] contains "
                        "this text, and chload's variants (--chload-vs's too) on their targets")
    parser.add_argument("--data", help="run only the datasets whose label ('trips csv.gz', "
                        "'streams jsonl.gz', ...) contains this text")
    parser.add_argument("--render", metavar="DIR", help="only re-draw results.md and "
                        "results.png from DIR/results.json and DIR/machine.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = _parse(argv)
    if args.render:
        results = json.loads(Path(args.render, "results.json").read_text())
        info = json.loads(Path(args.render, "machine.json").read_text())
        _log("re-drawn: " + ", ".join(report.write_all(args.render, results, info)))
        return 0
    profile = PROFILES["tiny" if args.tiny else "quick" if args.quick
                       else "large" if args.large else "full"]
    repeats = args.repeats or profile.repeats
    deadline = started + (args.budget or profile.budget_s)
    out = args.out or (str(ROOT / "bench" / "results") if profile.name == "full"
                       else f"/tmp/chload-bench-{profile.name}")
    work = tempfile.mkdtemp(prefix="chload-bench-")
    _log(f"profile {profile.name}: {repeats} repeats after {profile.warmup} warm-up, "
         f"budget {deadline - started:.0f} s; work dir {work}; results to {out}")
    try:
        results, info = _run(profile, repeats, args, work, deadline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    info["seconds_total"] = round(time.monotonic() - started, 1)
    paths = report.write_all(out, results, info)
    measured = len({r["method"] for r in results if r["seconds"]})
    _log(f"{measured} methods measured in {info['seconds_total']:.0f} s; wrote "
         + ", ".join(paths))
    return 0 if measured else 1


def _datasets(profile: Profile, cache: str, only: str | None) -> list[tuple[CaseSpec, Dataset]]:
    labels = [f"{spec.dataset} {spec.ext}" for spec in profile.cases]
    if only and not any(only in label for label in labels):
        raise SystemExit(f"scripts/bench: no dataset of the {profile.name} profile matches "
                         f"--data {only!r}; its datasets: {', '.join(labels)}")
    out = []
    for spec in profile.cases:
        if only and only not in f"{spec.dataset} {spec.ext}":
            continue
        t0 = time.monotonic()
        ds = ensure(Dataset(spec.dataset, spec.ext, spec.rows, spec.files), cache)
        _log(f"dataset {ds.label}: {ds.rows:,} rows, {ds.files} files, "
             f"{ds.size_bytes() / 1e6:,.1f} MB ({time.monotonic() - t0:.1f} s)")
        out.append((spec, ds))
    return out


def _run(profile: Profile, repeats: int, args: argparse.Namespace, work: str,
         deadline: float) -> tuple[list[dict], dict]:
    datasets = _datasets(profile, args.cache, args.data)
    src = snapshot_chload(work, args.chload)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH", "")) if p)  # every child measures it
    service = services.start_clickhouse_server(Path(work) / "server")
    try:
        server = Server(lambda sql: services.clickhouse_query(service, sql), service.pid)
        version = server.query("SELECT version()").strip()
        _log(f"ClickHouse server {version} at {service.url} (pid {service.pid})")
        env = Env(sys.executable, args.parallel, service.url, service.ports["tcp"])
        server.query(f"CREATE DATABASE IF NOT EXISTS {env.database}")
        why_not = probe_chload_server(env, work, server)
        _log("chload server target: " + (why_not or "available"))
        methods = select(all_methods(args.parallel) + _vs_methods(args.chload_vs, work),
                         args.only)
        unavailable = {m.key: why_not for m in methods
                       if why_not and m.chload and m.target == "server"}
        runner = Runner(env, work, server, deadline, _log)
        info = machine(profile, version, work, runner.device, args.chload)
        info["repeats"] = repeats  # --repeats, when given, over the profile's
        info["parallel"] = args.parallel
        results: list[dict] = []
        for spec, ds in datasets:
            case = Case(ds, [m for m in methods if _applies(m, spec)])
            outcomes = runner.run_case(case, profile.warmup, repeats, unavailable)
            results += [summarize(o) for o in outcomes]
    finally:
        service.stop()
    add_ratios(results)
    info["loadavg_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return results, info
