"""Does chload's load into 18.16 slow down as the server holds more tables? (A vs B)"""
import glob, os, subprocess, sys, time, statistics
sys.path.insert(0, "/work/main/scripts/services")
import services
from pathlib import Path

base = Path("/tmp/exp-tables"); base.mkdir(exist_ok=True)
srv = services.start_clickhouse_server(base)
port = srv.ports["http"]; pw = srv.credentials["password"]
url = f"http://127.0.0.1:{port}/"
files = sorted(glob.glob(os.path.expanduser("~/.cache/chload/bench/trips-csvgz-16x4000000-v2/*.csv.gz")))
env = {**os.environ, "CLICKHOUSE_PASSWORD": pw, "PYTHONSAFEPATH": "1", "PYTHONPATH": "/work/main"}

def q(sql):
    subprocess.run(["curl", "-sS", "-u", f"loader:{pw}", url, "--data-binary", sql], check=True, capture_output=True)

def chload(t):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "chload", "load", *files, "--table", t, "--target", f"http://loader@127.0.0.1:{port}/default", "-q"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return time.monotonic() - t0

def curl4(t):
    q(f"CREATE TABLE {t} AS proto")
    t0 = time.monotonic()
    cmd = f"printf '%s\\n' {' '.join(files)} | xargs -P4 -I{{}} curl -sS -f -u loader:{pw} -H 'Content-Encoding: gzip' --data-binary @{{}} '{url}?query=INSERT%20INTO%20{t}%20FORMAT%20CSVWithNames'"
    subprocess.run(cmd, shell=True, check=True)
    return time.monotonic() - t0

chload("proto_src"); q("CREATE TABLE proto AS proto_src")
def rounds(tag, n=5):
    a, b = [], []
    for i in range(n):
        a.append(chload(f"c_{tag}_{i}")); b.append(curl4(f"u_{tag}_{i}"))
    ca, cb = statistics.median(a), statistics.median(b)
    print(f"{tag}: chload {ca:.3f} s, curl x4 {cb:.3f} s, ratio {cb/ca:.2f}x  (chload {[round(x,3) for x in a]})", flush=True)

rounds("few")
for k in range(300):
    q(f"CREATE TABLE junk_{k} (a UInt64) ENGINE = MergeTree ORDER BY a")
    for j in range(4):
        q(f"INSERT INTO junk_{k} SELECT number FROM numbers({j*10}, 10)")
print("tables:", subprocess.run(["curl","-sS","-u",f"loader:{pw}",url+"?query=SELECT%20count()%20FROM%20system.parts%20WHERE%20active"],capture_output=True,text=True).stdout.strip(), "active parts", flush=True)
rounds("many")
srv.stop()
