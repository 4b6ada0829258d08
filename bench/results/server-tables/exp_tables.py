"""Does chload's load into 18.16 slow down as the server holds more tables, or right
after another load (its merges still running)?

16 trips csv.gz files (the bench cache) into fresh tables, chload and curl 4 at a time
alternating, 5 rounds; then 300 more MergeTree tables of 4 parts each; 5 rounds again.
Run from the repository: `python3 bench/results/server-tables/exp_tables.py`.
"""

import glob
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "services"))
import services  # noqa: E402

FILES = sorted(glob.glob(os.path.expanduser(
    "~/.cache/chload/bench/trips-csvgz-16x4000000-v2/*.csv.gz")))


def main() -> None:
    base = Path("/tmp/exp-tables")
    base.mkdir(exist_ok=True)
    server = services.start_clickhouse_server(base)
    port, password = server.ports["http"], server.credentials["password"]
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "CLICKHOUSE_PASSWORD": password, "PYTHONSAFEPATH": "1",
           "PYTHONPATH": str(ROOT)}

    def sql(statement: str) -> str:
        return subprocess.run(["curl", "-sS", "-u", f"loader:{password}", url,
                               "--data-binary", statement], check=True,
                              capture_output=True, text=True).stdout.strip()

    def chload(table: str) -> float:
        began = time.monotonic()
        subprocess.run([sys.executable, "-m", "chload", "load", *FILES, "--table", table,
                        "--target", f"http://loader@127.0.0.1:{port}/default", "-q"],
                       env=env, check=True)
        return time.monotonic() - began

    def curl4(table: str) -> float:
        sql(f"CREATE TABLE {table} AS proto")
        query = f"{url}?query=INSERT%20INTO%20{table}%20FORMAT%20CSVWithNames"
        began = time.monotonic()
        subprocess.run(f"printf '%s\\n' {' '.join(FILES)} | xargs -P4 -I{{}} curl -sS -f "
                       f"-u loader:{password} -H 'Content-Encoding: gzip' "
                       f"--data-binary @{{}} '{query}'", shell=True, check=True)
        return time.monotonic() - began

    def rounds(tag: str, n: int = 5) -> None:
        ours: list[float] = []
        theirs: list[float] = []
        for i in range(n):  # alternating
            ours.append(chload(f"c_{tag}_{i}"))
            theirs.append(curl4(f"u_{tag}_{i}"))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"{tag}: chload {a:.3f} s, curl x4 {b:.3f} s, ratio {b / a:.2f}x", flush=True)

    try:
        chload("proto_src")
        sql("CREATE TABLE proto AS proto_src")
        rounds("few")
        for k in range(300):
            sql(f"CREATE TABLE junk_{k} (a UInt64) ENGINE = MergeTree ORDER BY a")
            for j in range(4):
                sql(f"INSERT INTO junk_{k} SELECT number FROM numbers({j * 10}, 10)")
        print("active parts:", sql("SELECT count() FROM system.parts WHERE active"))
        rounds("many")
        if "--after-load" in sys.argv:  # each measured load right after another 4M rows
            for tag, warm in (("quiet", False), ("after", True), ("quiet2", False),
                              ("after2", True)):
                ours: list[float] = []
                theirs: list[float] = []
                for i in range(5):
                    for measure, out, name in ((chload, ours, "c"), (curl4, theirs, "u")):
                        if warm:
                            curl4(f"w_{tag}_{name}_{i}")
                        else:
                            time.sleep(3)
                        out.append(measure(f"{name}_{tag}_{i}"))
                a, b = statistics.median(ours), statistics.median(theirs)
                print(f"{tag}: chload {a:.3f} s, curl x4 {b:.3f} s, ratio {b / a:.2f}x",
                      flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
