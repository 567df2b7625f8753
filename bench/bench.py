#!/usr/bin/env python3
"""CapGate benchmark harness.

Starts a tuned throwaway PostgreSQL (`capgate db`, the embedded launcher), the mock provider
(`capgate mock`) and a release build of `capgate serve`; seeds 1,000 companies x 10 users and
one hot company with 640 users; drives load with wrk from a separate process, against the mock
provider directly and through CapGate in the same run; benchmarks the admission alone with
pgbench (and the seed design's COUNT(*)-then-INSERT for comparison); checks counters == ledger
(`capgate verify`) after every through-CapGate scenario; optionally soaks and records RSS.
Prints one table and writes BENCHMARKS.md.

Every process it starts listens on 127.0.0.1 only, and is stopped by its PID at the end.
"""
import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
WORK = os.path.join(ROOT, ".capgate", "bench")
# CAPGATE_BIN: another build to measure (an A/B of two commits in turn), default this checkout's release build.
BIN = os.environ.get("CAPGATE_BIN") or os.path.join(ROOT, ".build", "release", "capgate")
OPERATOR = "bench-operator-token-0123456789abcdef"  # operator tokens are at least 32 characters

started = []  # (name, Popen)


def log(message):
    print(message, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name, args, env=None, stdout=None):
    out = open(os.path.join(WORK, name + ".log"), "w") if stdout is None else stdout
    process = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    started.append((name, process))
    return process


def stop_all():
    for name, process in reversed(started):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def wait_http(url, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except Exception:
            time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {url}")


def psql(url, sql=None, file=None):
    args = ["psql", url, "-v", "ON_ERROR_STOP=1", "-q", "-X", "-t", "-A"]
    args += ["-f", file] if file else ["-c", sql]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()


def cpu_sample():
    """The machine's busy and idle clock ticks, and each started process's own (utime + stime)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:8]]
    busy, idle = sum(fields) - fields[3] - fields[4], fields[3] + fields[4]
    own = {}
    for name, process in started:
        try:
            with open(f"/proc/{process.pid}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            own[name] = int(parts[11]) + int(parts[12])
        except (OSError, IndexError):
            pass
    return busy, idle, own


def cpu_per_call(before, after, requests):
    """`BENCH_CPU=1`: CPU microseconds a call by process (the gateway, the mock; `rest` is
    PostgreSQL, wrk and the harness) and the machine's idle share during the run."""
    tick = 1e6 / os.sysconf("SC_CLK_TCK")
    busy, idle = after[0] - before[0], after[1] - before[1]
    result = {name: (after[2][name] - before[2].get(name, 0)) * tick / requests
              for name in after[2] if name in ("gateway", "mock")}
    result["rest"] = busy * tick / requests - sum(result.values())
    result["idle"] = idle / max(1, busy + idle)
    return result


def conversation_body(size):
    """A Messages body of about `size` bytes shaped as the SDK sends a long conversation: a system
    prompt, then user and assistant turns of prose (escaped quotes and newlines, non-ASCII text),
    ending with the user's question."""
    prose = ('The quarterly report says revenue grew 12 %, "ahead of plan".\n'
             'Kundenzufriedenheit stieg; les coûts ont baissé — see table 3.\n')
    def text(n):
        return prose * max(1, -(-n // len(prose.encode())))
    system = text(min(2048, size // 8))
    turns, used = [], len(system) + 120
    while used < size:
        content = text(min(4096, size - used))
        turns.append({"role": ("user", "assistant")[len(turns) % 2], "content": content})
        used += len(json.dumps(content, ensure_ascii=False).encode()) + 32
    if len(turns) % 2 == 0:
        turns.append({"role": "user", "content": "Hello"})
    return json.dumps({"model": "claude-bench", "max_tokens": 16, "system": system, "messages": turns},
                      ensure_ascii=False, separators=(",", ":")).encode()


def wrk(url, connections, seconds, keys_file=None, stream=False, per_call=False, body_file=None):
    """One wrk run. `per_call` (concurrency 1): also every call's latency as measured (wrk's own
    percentiles are corrected for coordinated omission) and the disk's fsync stalls meanwhile.
    `body_file`: the body to send (``conversation_body``), else the one-line "Hello" call."""
    threads = max(1, min(2, connections))
    env = {"KEYS_FILE": keys_file or "", "STREAM": "1" if stream else "0", "BODY_FILE": body_file or ""}
    latency_file = os.path.join(WORK, "latency")
    if per_call:
        env["LATENCY_FILE"] = latency_file
        for name in os.listdir(WORK):
            if name.startswith("latency."):
                os.remove(os.path.join(WORK, name))
    before = cpu_sample()
    with DiskProbe(WORK, enabled=per_call) as probe:
        out = subprocess.run(
            ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "10s",
             "-s", os.path.join(BENCH, "messages.lua"), url],
            env={**os.environ, **env}, capture_output=True, text=True, check=True,
        ).stdout
    m = re.search(r"RESULT requests=(\d+) non2xx=(\d+) errors=(\d+) duration_us=(\d+) p50_us=(\d+) p99_us=(\d+)", out)
    if not m:
        raise SystemExit("wrk printed no result:\n" + out)
    requests, non2xx, errors, duration, p50, p99 = map(int, m.groups())
    result = {"requests": requests, "non2xx": non2xx, "errors": errors, "rps": requests / (duration / 1e6),
              "p50_ms": p50 / 1000, "p99_ms": p99 / 1000}
    if os.environ.get("BENCH_CPU") and requests:
        result["cpu"] = cpu_per_call(before, cpu_sample(), requests)
        log(f"  {url} c={connections}: {result['rps']:.0f} rps; CPU us a call: "
            + ", ".join(f"{k} {v:.0f}" for k, v in result["cpu"].items() if k != "idle")
            + f"; idle {result['cpu']['idle']:.1%}")
    if per_call:
        calls = []
        for name in os.listdir(WORK):
            if name.startswith("latency."):
                with open(os.path.join(WORK, name)) as f:
                    calls += [int(line) for line in f if line.strip()]
        calls.sort()
        if not calls:
            raise SystemExit("wrk wrote no per-call latencies")
        result["calls"] = {"p50_ms": calls[len(calls) // 2] / 1000, "p99_ms": calls[int(len(calls) * 0.99)] / 1000,
                           "max_ms": calls[-1] / 1000, "over_20ms": sum(1 for x in calls if x > 20000),
                           "disk_stalls_ms": probe.stalls}
    return result


class DiskProbe:
    """While a run goes on, writes 4 KiB and fdatasyncs it every 20 ms in the database's
    filesystem, keeping every sync slower than 20 ms: the disk stalls a durable commit waits out."""

    def __init__(self, directory, enabled=True):
        self.path = os.path.join(directory, "disk-probe")
        self.enabled = enabled
        self.stalls = []
        self.stop = threading.Event()

    def __enter__(self):
        if self.enabled:
            self.thread = threading.Thread(target=self.run, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.stop.set()
            self.thread.join()

    def run(self):
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            block, offset = b"\0" * 4096, 0
            while not self.stop.wait(0.02):
                t0 = time.perf_counter()
                os.pwrite(fd, block, offset)
                os.fdatasync(fd)
                elapsed = (time.perf_counter() - t0) * 1000
                if elapsed > 20:
                    self.stalls.append(round(elapsed))
                offset = (offset + 4096) % (1 << 20)
        finally:
            os.close(fd)
            os.remove(self.path)


# `--ab SETTING`: the seed file that turns the setting on (re-run before each of its runs) and
# the statement that turns it off again (caps only), so both alternate run by run in one stack.
# A token window bounds only a priced call (SPEC §11: an unpriced model is 400 where one applies),
# so the settings with one price the benchmark's model in both halves: the baseline is the same
# deployment, priced, without the windows.
PRICED = ("INSERT INTO prices (model, effective_from, context_window, input, output, cache_write_5m, cache_write_1h, "
          "cache_read) VALUES ('claude-*', '2020-01-01Z', 200000, 3000000, 15000000, 3750000, 6000000, 300000) "
          "ON CONFLICT DO NOTHING; ANALYZE prices; ")

AB_SETTINGS = {
    # Off is caps only as `bench.py` without `--budgets` runs it: no budgets and no price book
    # (a priced call is held and settled at its cost with or without a budget).
    "budgets": ("budgets.sql", "UPDATE plans SET monthly_company_budget = NULL, monthly_user_budget = NULL WHERE id = 'bench'; "
                               "DELETE FROM prices WHERE model = 'claude-*'"),
    "rate": ("rate.sql", PRICED + "UPDATE plans SET company_rpm = NULL, user_rpm = NULL, company_tpm = NULL, user_tpm = NULL, "
                                  "user_concurrency = NULL WHERE id = 'bench'"),
    "rate-rpm": ("rate-rpm.sql", "UPDATE plans SET company_rpm = NULL, user_rpm = NULL WHERE id = 'bench'"),
    # The parts of `rate` alone, to see which costs what: the concurrency limit, the token windows.
    "rate-concurrency": ("UPDATE plans SET user_concurrency = 1000000 WHERE id = 'bench'",
                         "UPDATE plans SET user_concurrency = NULL WHERE id = 'bench'"),
    "rate-tpm": (PRICED + "UPDATE plans SET company_tpm = 1000000000000, user_tpm = 1000000000000 WHERE id = 'bench'",
                 PRICED + "UPDATE plans SET company_tpm = NULL, user_tpm = NULL WHERE id = 'bench'"),
    # The four minute windows without the concurrency limit.
    # The ledger's rollup triggers (migration 0028, docs/ledger.md#rollups): on as deployed, off
    # disabled; what keeping the rollups costs the admission and the settlement.
    "rollups": ("ALTER TABLE usage_ledger ENABLE TRIGGER usage_ledger_rollup_insert; "
                "ALTER TABLE usage_ledger ENABLE TRIGGER usage_ledger_rollup_update",
                "ALTER TABLE usage_ledger DISABLE TRIGGER usage_ledger_rollup_insert; "
                "ALTER TABLE usage_ledger DISABLE TRIGGER usage_ledger_rollup_update"),
    "rate-windows": (PRICED + "UPDATE plans SET company_rpm = 1000000000, user_rpm = 1000000000, company_tpm = 1000000000000, "
                              "user_tpm = 1000000000000 WHERE id = 'bench'",
                     PRICED + "UPDATE plans SET company_rpm = NULL, user_rpm = NULL, company_tpm = NULL, user_tpm = NULL "
                              "WHERE id = 'bench'"),
}


# What a call's ledger row shows when the `--ab` setting applied to it: each run is checked to
# have run with the setting on (every such run has such rows) or off (none).
AB_MARK = {"budgets": "hold_micros IS NOT NULL"}


def rollup_calls(url):
    """Every call the ledger's rollups count, compacted or not."""
    return int(psql(url, "SELECT coalesce(sum(calls), 0) FROM usage_rollups_all").strip())


def ab_check(url, setting, since, on, rollups_before=None):
    """Fails the benchmark when a run did not run as labelled (the toggle did not take)."""
    if setting == "rollups":
        marked = rollup_calls(url) - rollups_before
        if (marked > 0) != on:
            raise SystemExit(f"--ab rollups: a run meant to be {'on' if on else 'off'} added {marked} calls to the rollups")
        return
    mark = AB_MARK.get(setting, "rate_scopes <> 0")
    marked = int(psql(url, f"SELECT count(*) FROM usage_ledger WHERE created_at >= '{since}' AND {mark}").strip())
    if (marked > 0) != on:
        raise SystemExit(f"--ab {setting}: a run meant to be {'on' if on else 'off'} had {marked} calls with {mark}")


def ab_on(url, setting):
    """Turns an `--ab` setting on: its seed file, or its statement."""
    on = AB_SETTINGS[setting][0]
    if on.endswith(".sql"):
        psql(url, file=os.path.join(BENCH, on))
    else:
        psql(url, on)


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2


# Student's t at 95 % (two-sided) by degrees of freedom, for `ratio_interval`.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 11: 2.20, 12: 2.18,
       13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09, 20: 2.09}


def ratio_interval(ratios):
    """The pairs' geometric mean ratio and its 95 % interval (t over the log ratios): how far
    apart two settings must be before `--ab` with this many pairs can tell them apart."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    if n < 2:
        return math.exp(mean), math.exp(mean), math.exp(mean)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = T95.get(n - 1, 2.0) * sd / math.sqrt(n)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def median_run(runs):
    """The run with the median requests/s, with every run's requests/s beside it."""
    ordered = sorted(runs, key=lambda r: r["rps"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all_rps"] = [r["rps"] for r in runs]
    chosen["non2xx"] = sum(r["non2xx"] for r in runs)
    chosen["errors"] = sum(r["errors"] for r in runs)
    if "calls" in chosen:
        chosen["all_calls"] = [r["calls"] for r in runs]
    return chosen


def pgbench(url, script, clients, seconds):
    out = subprocess.run(
        ["pgbench", "-n", "-f", os.path.join(BENCH, script), "-c", str(clients), "-j", str(min(clients, 2)),
         "-T", str(seconds), url],
        capture_output=True, text=True, check=True,
    ).stdout
    m = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    lat = re.search(r"latency average = ([\d.]+) ms", out)
    return float(m.group(1)), float(lat.group(1)) if lat else None


def verify(url):
    result = subprocess.run([BIN, "verify"], env={**os.environ, "DATABASE_URL": url}, capture_output=True, text=True)
    return result.returncode == 0, result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr.strip()


def rss_kb(pid, field="VmRSS"):
    """`field` of /proc/PID/status in KiB: VmRSS now, VmHWM the peak since the process started."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def start_database():
    """The embedded PostgreSQL (`capgate db`), durable and sized for this machine; its URL and settings."""
    # PostgreSQL: durable commits (synchronous_commit=on, fsync on), sized for this machine.
    settings = {"shared_buffers": "1GB", "synchronous_commit": "on", "max_connections": "300",
                "wal_buffers": "16MB", "max_wal_size": "4GB", "checkpoint_timeout": "15min",
                "work_mem": "16MB", "random_page_cost": "1.1"}
    # Extra server settings for profiling, ";"-separated, e.g. BENCH_PG_SETTINGS="shared_preload_libraries=
    # pg_stat_statements;pg_stat_statements.track=all" (with --pause, then CREATE EXTENSION).
    for item in filter(None, os.environ.get("BENCH_PG_SETTINGS", "").split(";")):
        k, _, v = item.partition("=")
        settings[k.strip()] = v.strip()
    url_file = os.path.join(WORK, "database_url")
    db_args = [BIN, "db", "--directory", os.path.join(WORK, "postgres"), "--url-file", url_file]
    for k, v in settings.items():
        db_args += ["--setting", f"{k}={v}"]
    start("postgres", db_args)
    for _ in range(300):
        if os.path.exists(url_file):
            break
        time.sleep(0.2)
    return open(url_file).read().strip(), settings


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=10, help="duration of each wrk scenario")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each scenario (the median is reported)")
    parser.add_argument("--warmup", type=int, default=20, help="seconds of load on each gateway before measuring")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--soak", type=int, default=0, help="soak seconds at concurrency 64 (the target run uses 600)")
    parser.add_argument("--durability", choices=["durable", "relaxed"], default="durable")
    parser.add_argument("--ledger-rows", default="10000,100000,1000000")
    parser.add_argument("--output", help="the report (default BENCHMARKS.md; with --scale, .capgate/bench-scale.md)")
    parser.add_argument("--only-http", action="store_true", help="skip the pgbench and ledger-size parts")
    parser.add_argument("--provider", choices=["lean", "full"], default="lean",
                        help="the mock provider: lean (plain SwiftNIO, `capgate mock --lean`) or full (the Hummingbird mock the tests use)")
    parser.add_argument("--pause", type=int, default=0, help="keep the stack up this many seconds after seeding (for profiling)")
    parser.add_argument("--features", action="store_true",
                        help="seed bench/features.sql: a route table and two features with bounded limits, every call charging one")
    parser.add_argument("--budgets", action="store_true",
                        help="seed bench/budgets.sql: a price book row for the model and company and user cost budgets, every call held and settled")
    parser.add_argument("--rate", action="store_true",
                        help="seed bench/rate.sql: every rate window and a concurrency limit set (never reached), every call counted, slotted and ended")
    parser.add_argument("--rate-rpm", action="store_true",
                        help="seed bench/rate-rpm.sql: the company's and the user's call windows only (no token window, no concurrency limit)")
    parser.add_argument("--quick", action="store_true",
                        help="only the rows a change is compared on: many companies c=1 and c=64, one hot company c=64 (no relaxed or info gateway)")
    parser.add_argument("--only", default="",
                        help="keep only the rows named, as 'scenario:concurrency' separated by ';' (e.g. 'many companies:1'), "
                             "for a longer A/B of one row")
    parser.add_argument("--bodies", default="",
                        help="comma-separated body sizes in bytes (e.g. 1024,16384,131072): only rows of many companies at c=1 and c=64 with a "
                             "conversation body of each size (system prompt and turns, as the SDK sends), and the gateway's peak RSS after each size")
    parser.add_argument("--ab", choices=sorted(AB_SETTINGS),
                        help="one stack, caps only and the setting alternating run by run (the setting's seed file or statement re-run to "
                             "turn it on, its columns set to NULL to turn it off): each pair of adjacent runs gives a ratio, and their median is reported")
    parser.add_argument("--notifications", action="store_true",
                        help="threshold notifications on: a signed-webhook receiver on loopback, the gateway's deliverer sending a backlog of "
                             "pending rows while the calls are measured")
    parser.add_argument("--scale", action="store_true",
                        help="the ledger at scale (issue #50 item 4): an empty and a filled ledger (--scale-rows over 12 months, generated in SQL by "
                             "bench/ledger_scale.sql) in one sitting: admission, the biggest company's reads, rollover, export, drop, sizes, verify")
    parser.add_argument("--scale-rows", type=int, default=50_000_000, help="ledger rows for --scale (12 months, the disk checked month by month)")
    parser.add_argument("--scale-hot-share", type=float, default=0.08, help="the biggest company's share of the --scale rows")
    parser.add_argument("--scale-fill-minutes", type=int, default=0,
                        help="stop the --scale fill before a month likely to end past this many minutes (0: no limit); the most recent months are filled first")
    parser.add_argument("--scale-reads", type=int, default=50, help="requests per read measured by --scale (the p50 is reported)")
    args = parser.parse_args()
    if args.output is None:
        args.output = os.path.join(ROOT, ".capgate", "bench-scale.md") if args.scale else os.path.join(ROOT, "BENCHMARKS.md")

    if not os.access(BIN, os.X_OK):
        raise SystemExit(f"{BIN} missing: run `swift build -c release --product capgate` (bench/run does)")
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK, exist_ok=True)
    if args.scale:
        return scale(args)
    results = {"wrk": [], "pgbench": [], "batched": [], "ledger": [], "verify": [], "soak": [], "notifications": None, "ab": [], "reader": []}
    try:
        url, settings = start_database()
        log("migrating and seeding…")
        subprocess.run([BIN, "migrate"], env={**os.environ, "DATABASE_URL": url}, check=True, capture_output=True)
        psql(url, file=os.path.join(BENCH, "seed.sql"))
        if args.features:
            psql(url, file=os.path.join(BENCH, "features.sql"))
        if args.budgets:
            psql(url, file=os.path.join(BENCH, "budgets.sql"))
        if args.rate:
            psql(url, file=os.path.join(BENCH, "rate.sql"))
        if args.rate_rpm:
            psql(url, file=os.path.join(BENCH, "rate-rpm.sql"))
        if args.ab:
            # Warmed up with the setting on (its window and counter rows made), measured alternating.
            ab_on(url, args.ab)
        receiver = None
        if args.notifications:
            receiver = WebhookSink()
            log(f"notifications: receiver on {receiver.url}")
        many_keys = os.path.join(WORK, "keys_many.txt")
        hot_keys = os.path.join(WORK, "keys_hot.txt")
        with open(many_keys, "w") as f:
            f.writelines(f"cg_bench_c{i}_u{j}\n" for i in range(1, 1001) for j in range(1, 11))
        with open(hot_keys, "w") as f:
            f.writelines(f"cg_bench_hot_u{j}\n" for j in range(1, 641))

        mock_port, gateway_port = free_port(), free_port()
        start("mock", [BIN, "mock", "--port", str(mock_port)] + (["--lean"] if args.provider == "lean" else []))
        wait_http(f"http://127.0.0.1:{mock_port}/v1/models")
        gateway_env = {"DATABASE_URL": url, "UPSTREAM_URL": f"http://127.0.0.1:{mock_port}", "OPERATOR_TOKEN": OPERATOR,
                       "HTTP_PORT": str(gateway_port), "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "warning"), "DATABASE_MAX_CONNECTIONS": "16",
                       "DATABASE_DURABILITY": args.durability}
        if receiver:
            gateway_env.update({"NOTIFY_WEBHOOK_URL": receiver.url, "NOTIFY_WEBHOOK_SECRET": "whsec_" + "YmVuY2gtc2VjcmV0LWJlbmNoLXNlY3JldA=="})
        gateway = start("gateway", [BIN, "serve"], env=gateway_env)
        wait_http(f"http://127.0.0.1:{gateway_port}/readyz")
        direct = f"http://127.0.0.1:{mock_port}"
        through = f"http://127.0.0.1:{gateway_port}"

        if args.pause:
            log(f"stack up: gateway {through} (pid {gateway.pid}), provider {direct}, database {url}; pausing {args.pause} s")
            time.sleep(args.pause)
        scenarios = [("many companies", 1, many_keys, False), ("many companies", 16, many_keys, False),
                     ("many companies", 64, many_keys, False), ("one hot company", 1, hot_keys, False),
                     ("one hot company", 16, hot_keys, False), ("one hot company", 64, hot_keys, False),
                     ("streaming, many companies", 16, many_keys, True)]
        if args.quick:
            scenarios = [("many companies", 1, many_keys, False), ("many companies", 64, many_keys, False),
                         ("one hot company", 64, hot_keys, False)]
        # Real-sized bodies (issue #51): each size at c=1 and c=64, smallest first, so the
        # gateway's peak RSS (VmHWM) read after each size is that size's peak.
        body_of = {}
        if args.bodies:
            scenarios = []
            for size in [int(x) for x in args.bodies.split(",") if x.strip()]:
                name = f"many companies, {size / 1024:g} KB body"
                path = os.path.join(WORK, f"body-{size}.json")
                with open(path, "wb") as f:
                    f.write(conversation_body(size))
                body_of[name] = path
                scenarios += [(name, 1, many_keys, False), (name, 64, many_keys, False)]
        if args.only:
            wanted = {tuple(x.rsplit(":", 1)) for x in args.only.split(";") if x.strip()}
            scenarios = [s for s in scenarios if (s[0], str(s[1])) in wanted]
            if not scenarios:
                raise SystemExit(f"--only {args.only!r} names no row")
        gateways = {name: through for name, _, _, _ in scenarios}
        if args.durability == "durable" and not args.quick and not args.bodies:
            # The opt-in relaxed mode beside the durable default: a second gateway on the same
            # database with database.durability = relaxed.
            relaxed_port = free_port()
            start("gateway-relaxed", [BIN, "serve"],
                  env={**gateway_env, "HTTP_PORT": str(relaxed_port), "DATABASE_DURABILITY": "relaxed"})
            wait_http(f"http://127.0.0.1:{relaxed_port}/readyz")
            relaxed = f"http://127.0.0.1:{relaxed_port}"
            extra = [("many companies, relaxed durability", 1, many_keys, False),
                     ("many companies, relaxed durability", 64, many_keys, False),
                     ("one hot company, relaxed durability", 64, hot_keys, False)]
            scenarios += extra
            gateways.update({name: relaxed for name, _, _, _ in extra})
            # The rows above run the gateway at LOG_LEVEL=warning; a real deployment keeps the
            # default `info` (one log line per request, written to a file here).
            info_port = free_port()
            start("gateway-info", [BIN, "serve"], env={**gateway_env, "HTTP_PORT": str(info_port), "LOG_LEVEL": "info"})
            wait_http(f"http://127.0.0.1:{info_port}/readyz")
            logged = [("many companies, LOG_LEVEL=info", 64, many_keys, False)]
            scenarios += logged
            gateways.update({name: f"http://127.0.0.1:{info_port}" for name, _, _, _ in logged})
        # Warm-up, then a settled database: plans made, statistics current (the first scenario
        # measured right after seeding ran slower than the same scenario later in the run).
        for target in sorted(set(gateways.values())):
            wrk(target, 64, args.warmup, many_keys)
            wrk(target, 64, max(1, args.warmup // 4), hot_keys)
        psql(url, "VACUUM ANALYZE")
        # Seeding and warm-up leave most of the 1 GB buffer pool dirty; writing it now keeps the
        # first timed checkpoint's flush (p99 stalls of 100+ ms at c=1 on this shared disk) out
        # of the scenarios. A long-running database carries no such backlog.
        psql(url, "CHECKPOINT")
        peak_before = rss_kb(gateway.pid, "VmHWM")
        if receiver:
            # A backlog for the deliverer to send while every scenario is measured: each row is
            # claimed, signed, POSTed and marked in transactions of its own beside the admissions.
            backlog = args.seconds * args.repeats * len(scenarios) * 2 * 200
            psql(url, f"""INSERT INTO notifications (company_id, user_id, scope, span, window_start, window_end, threshold, used, limit_value)
                SELECT md5('c' || (1 + i % 1000))::uuid, NULL, 'company', 'period', now() - (i || ' seconds')::interval, now() + interval '1 day',
                       80, 80, 100 FROM generate_series(1, {backlog}) i;""")
            log(f"notifications: {backlog} pending rows queued for delivery")
        for name, c, keys, stream in scenarios if args.ab else []:
            # Direct, then caps only and the setting in one stack, their order swapped each
            # repeat (ABBA: a drift of the machine does not favour either); each adjacent pair
            # of runs gives a ratio (requests/s) and a difference (call-by-call p50 at c=1).
            ds, offs, ons = [], [], []
            off_sql = AB_SETTINGS[args.ab][1]
            for i in range(args.repeats):
                ds.append(wrk(direct, c, args.seconds, None, stream, per_call=c == 1))
                for on in ([False, True] if i % 2 == 0 else [True, False]):
                    if on:
                        ab_on(url, args.ab)
                    else:
                        psql(url, off_sql)
                    since = psql(url, "SELECT now()").strip()
                    # Calls settle after their answers: the last run's settlements land first.
                    time.sleep(1) if args.ab == "rollups" else None
                    before = rollup_calls(url) if args.ab == "rollups" else None
                    (ons if on else offs).append(wrk(gateways[name], c, args.seconds, keys, stream, per_call=c == 1))
                    ab_check(url, args.ab, since, on, before)
            if args.ab == "rollups":
                # The calls of the runs with the triggers off are in no rollup: made again from
                # the ledger, so that verify checks the counters (and the rollups) as after any run.
                ab_on(url, args.ab)
                psql(url, "SELECT capgate_rollup_rebuild()")
            ok, line = verify(url)
            results["verify"].append((f"{name} c={c}, caps only and {args.ab} alternating", ok, line))
            d = median_run(ds)
            for label, runs in [("caps only", offs), (args.ab, ons)]:
                results["wrk"].append({"scenario": f"{name}, {label}", "c": c, "direct": d, "capgate": median_run(runs)})
            ratios = [b["rps"] / a["rps"] for a, b in zip(offs, ons)]
            added = [b["calls"]["p50_ms"] - a["calls"]["p50_ms"] for a, b in zip(offs, ons)] if c == 1 else []
            results["ab"].append({"scenario": name, "c": c, "ratios": ratios, "added_p50": added})
            mean, lo, hi = ratio_interval(ratios)
            log(f"{name:28} c={c:<3} {args.ab} / caps only: median ratio {median(ratios):.3f} ({' / '.join(f'{r:.3f}' for r in ratios)})"
                + f"; geometric mean {mean:.3f}, 95 % interval {lo:.3f} to {hi:.3f}"
                + (f"; added p50 median {median(added):+.3f} ms ({' / '.join(f'{x:+.3f}' for x in added)})" if added else ""))
        for name, c, keys, stream in [] if args.ab else scenarios:
            # Direct and through CapGate alternate `repeats` times; the run with the median
            # requests/s of each is reported, with the spread of all runs.
            ds, gs = [], []
            body = body_of.get(name)
            for _ in range(args.repeats):
                ds.append(wrk(direct, c, args.seconds, None, stream, per_call=c == 1, body_file=body))
                gs.append(wrk(gateways[name], c, args.seconds, keys, stream, per_call=c == 1, body_file=body))
            d, g = median_run(ds), median_run(gs)
            ok, line = verify(url)
            results["verify"].append((f"{name} c={c}", ok, line))
            row = {"scenario": name, "c": c, "direct": d, "capgate": g}
            if body:
                row["body_bytes"] = os.path.getsize(body)
                row["peak_kb"] = rss_kb(gateway.pid, "VmHWM")
                row["peak_before_kb"] = peak_before
            results["wrk"].append(row)
            log(f"{name:28} c={c:<3} direct {d['rps']:9.0f} rps p50 {d['p50_ms']:.3f} p99 {d['p99_ms']:.3f} | "
                f"capgate {g['rps']:8.0f} rps p50 {g['p50_ms']:.3f} p99 {g['p99_ms']:.3f} non2xx {g['non2xx']} | verify {'ok' if ok else 'MISMATCH'}")

        if body_of:
            # The body reader alone, in one process, against Foundation's JSONSerialization.
            out = subprocess.run([BIN, "bench-reader", "--seconds", "2"] + list(dict.fromkeys(body_of.values())),
                                 capture_output=True, text=True, check=True).stdout
            for m in re.finditer(r"RESULT reader=(\S+) bytes=(\d+) reads=(\d+) mbps=([\d.]+)", out):
                results["reader"].append((m.group(1), int(m.group(2)), float(m.group(4))))
                log(f"reader {m.group(1):30} {int(m.group(2)):7} bytes: {float(m.group(4)):8.1f} MB/s")
        for script, label in [] if args.only_http else [("admit_many.sql", "1,000 companies"), ("admit_hot.sql", "one hot company")]:
            for clients in [1, 8, 32, 64]:
                tps, latency = pgbench(url, script, clients, args.pgbench_seconds)
                results["pgbench"].append((label, clients, tps, latency))
                log(f"pgbench admission {label:16} clients={clients:<3} {tps:9.0f} tps  avg {latency} ms")

        # The gateway's batched admission alone: 32 calls per transaction; one client is one
        # gateway (one batch in flight), 8 clients are 8 gateways on one database.
        for script, label in [] if args.only_http else [("admit_batch_many.sql", "1,000 companies"), ("admit_batch_hot.sql", "one hot company")]:
            for clients in [1, 8]:
                tps, latency = pgbench(url, script, clients, args.pgbench_seconds)
                results["batched"].append((label, clients, tps, latency))
                log(f"pgbench batched admission {label:16} clients={clients:<3} {tps * 32:9.0f} admissions/s  avg {latency} ms a batch")

        # Admission cost against ledger size: CapGate's counters vs the seed design's COUNT(*).
        for rows in [] if args.only_http else [int(x) for x in args.ledger_rows.split(",") if x]:
            psql(url, "TRUNCATE seed_usage")
            psql(url, f"INSERT INTO seed_usage SELECT md5('seed')::uuid, md5('seed' || (i % 640))::uuid, now() - (i % 1000) * interval '1 second' FROM generate_series(1, {rows}) i; ANALYZE seed_usage;")
            psql(url, f"""INSERT INTO usage_ledger (company_id, period_id, user_id, units, method, route, request_id, outcome)
                SELECT p.company_id, p.id, md5('hot' || 'u' || (1 + i % 640))::uuid, 1, 'POST', '/v1/messages', 'fill', 'charged'
                  FROM plan_periods p, generate_series(1, {rows}) i WHERE p.company_id = md5('hot')::uuid;
                UPDATE company_usage SET used = (SELECT count(*) FROM usage_ledger l WHERE l.company_id = company_usage.company_id AND l.period_id = company_usage.period_id AND outcome = 'charged')
                 WHERE company_id = md5('hot')::uuid;
                ANALYZE usage_ledger;""")
            capgate_tps, _ = pgbench(url, "admit_hot.sql", 1, args.pgbench_seconds)
            seed_tps, seed_latency = pgbench(url, "count_then_insert.sql", 1, args.pgbench_seconds)
            results["ledger"].append((rows, capgate_tps, seed_tps, seed_latency))
            log(f"ledger rows {rows:>9}: capgate admission {capgate_tps:8.0f} tps | COUNT(*) then INSERT {seed_tps:8.1f} tps ({seed_latency} ms)")
        psql(url, "DELETE FROM usage_ledger WHERE request_id = 'fill'")
        psql(url, "UPDATE company_usage c SET used = (SELECT count(*) FROM usage_ledger l WHERE l.company_id = c.company_id AND l.period_id = c.period_id AND l.outcome = 'charged')")
        psql(url, "UPDATE user_usage u SET used = (SELECT count(*) FROM usage_ledger l WHERE l.company_id = u.company_id AND l.period_id = u.period_id AND l.user_id = u.user_id AND l.outcome = 'charged')")

        if args.soak > 0:
            log(f"soak: {args.soak} s at concurrency 64, RSS every 10 s")
            soak = subprocess.Popen(
                ["wrk", "-t", "2", "-c", "64", "-d", f"{args.soak}s", "--timeout", "10s", "-s", os.path.join(BENCH, "messages.lua"), through],
                env={**os.environ, "KEYS_FILE": many_keys, "STREAM": "0"}, stdout=subprocess.PIPE, text=True)
            t0 = time.time()
            while soak.poll() is None:
                results["soak"].append((round(time.time() - t0), rss_kb(gateway.pid)))
                time.sleep(10)
            ok, line = verify(url)
            results["verify"].append(("soak", ok, line))
        if receiver:
            delivered = psql(url, "SELECT count(*) FILTER (WHERE status = 'delivered'), count(*) FROM notifications").strip()
            results["notifications"] = f"{receiver.count} webhooks received; delivered / written rows: {delivered.replace('|', ' / ')}"
            log("notifications: " + results["notifications"])
    finally:
        stop_all()
        if receiver:
            receiver.stop()
    write_report(args, results, settings)


# `--scale` (issue #50 item 4): the ledger at scale against an empty ledger, in one sitting.
SCALE_TARGETS = {"added_p50": 0.10, "rps": 0.10, "read_ms": 50, "rollover_s": 10, "export_rows_s": 200000}
SCALE_MONTHS = 12
SCALE_DISK_FLOOR = 15 * 2**30  # the fill stops before less than this would remain free
SCALE_BYTES_A_ROW = 750        # ledger row and indexes, rollups and their changes, WAL (50 M rows, session 41: about 750)


def database_url(url, name):
    """The same server's URL with another database name."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def timed_psql(url, sql):
    t0 = time.perf_counter()
    out = psql(url, sql)
    return time.perf_counter() - t0, out


def scale_fill(url, rows, hot_share, minutes):
    """Fills the ledger month by month (bench/ledger_scale.sql), the current month first, compacting
    the rollups after each month, logging progress. Stops before a month that would leave less than
    SCALE_DISK_FLOOR free, or (`minutes`, 0 no limit) would likely end after that many minutes: the
    ledger then holds the most recent months. Returns the rows written and the fill's timings."""
    months = psql(url, f"SELECT m FROM bench_scale.months({SCALE_MONTHS}) m ORDER BY m DESC").splitlines()
    each = rows // len(months)
    written, fill_s, compact_s, stopped, t0, last = 0, 0.0, 0.0, None, time.perf_counter(), 0.0
    for i, month in enumerate(months):
        free = shutil.disk_usage(WORK).free
        if free - each * SCALE_BYTES_A_ROW < SCALE_DISK_FLOOR:
            stopped = f"stopped before {month[:7]}: {free / 2**30:.1f} GiB free"
        elif minutes and time.perf_counter() - t0 + last > minutes * 60:
            stopped = f"stopped before {month[:7]}: the fill's {minutes} minutes"
        if stopped:
            log("fill: " + stopped)
            break
        month_t0 = time.perf_counter()
        seconds, n = timed_psql(url, f"SELECT bench_scale.fill_month('{month}', {each}, {hot_share})")
        compact, moved = timed_psql(url, "SELECT capgate_rollup_compact()")
        written, fill_s, compact_s = written + int(n), fill_s + seconds, compact_s + compact
        last = time.perf_counter() - month_t0
        log(f"fill {month[:7]}: {int(n):,} rows in {seconds:.0f} s ({int(n) / seconds:,.0f} rows/s), rollups compacted "
            f"({int(moved):,} changes) in {compact:.0f} s; {written:,} rows so far, {shutil.disk_usage(WORK).free / 2**30:.1f} GiB free")
    seconds, _ = timed_psql(url, "SELECT bench_scale.finish()")
    log(f"fill: counters set from the ledger in {seconds:.0f} s")
    return {"rows": written, "fill_s": fill_s, "compact_s": compact_s, "counters_s": seconds, "stopped": stopped}


def read_latency(base, path, count):
    """`count` sequential GETs of `path` as the operator on one kept-alive connection: p50, p99 ms."""
    import http.client
    host, port = base.split("//", 1)[1].split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    times = []
    for _ in range(count + 2):
        t0 = time.perf_counter()
        connection.request("GET", path, headers={"Authorization": f"Bearer {OPERATOR}"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path}: {response.status} {body[:300]!r}")
        times.append((time.perf_counter() - t0) * 1000)
    connection.close()
    times = sorted(times[2:])  # the first two open the connection and warm the plan
    return {"p50_ms": median(times), "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))], "bytes": len(body)}


def run_sampled(args, env=None):
    """Runs a command to its end, sampling its RSS every 0.2 s: wall seconds, stdout, peak RSS
    (VmHWM) and the RSS samples (KiB)."""
    t0 = time.perf_counter()
    process = subprocess.Popen(args, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    samples, peak = [], 0
    while process.poll() is None:
        try:
            samples.append(rss_kb(process.pid))
            peak = max(peak, rss_kb(process.pid, "VmHWM"))
        except OSError:
            pass
        time.sleep(0.2)
    out = process.stdout.read()
    seconds = time.perf_counter() - t0
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {process.returncode}\n{out}")
    return seconds, out.strip(), peak, samples


def database_sizes(url):
    """The database's size, and the ledger's partitions and the rollups with their indexes (bytes)."""
    total = int(psql(url, "SELECT pg_database_size(current_database())"))
    parts = psql(url, """SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid), coalesce(s.n_live_tup, 0)
                           FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
                          WHERE c.relkind IN ('r', 'p') AND (c.relname LIKE 'usage_ledger_p%'
                                OR c.relname IN ('usage_ledger_default', 'usage_rollups', 'usage_rollup_changes'))
                          ORDER BY c.relname""")
    return total, [(name, int(t), int(h), int(n)) for name, t, h, n in (line.split("|") for line in parts.splitlines())]


def scale(args):
    """The ledger at scale (issue #50 item 4): two databases on one server, `capgate_empty` (the
    seed only) and `capgate` (the seed and `--scale-rows` ledger rows over 12 months, generated in
    SQL), each with its own gateway on the same mock provider; admission ABBA between the two, the
    reads, rollover, export, drop, sizes and verify."""
    results = {"verify": []}
    try:
        url, settings = start_database()
        empty_url = database_url(url, "capgate_empty")
        psql(url, "CREATE DATABASE capgate_empty")
        log("migrating and seeding both databases…")
        for u in (url, empty_url):
            subprocess.run([BIN, "migrate"], env={**os.environ, "DATABASE_URL": u}, check=True, capture_output=True)
            psql(u, file=os.path.join(BENCH, "seed.sql"))
            psql(u, file=os.path.join(BENCH, "ledger_scale.sql"))
            psql(u, f"SELECT bench_scale.prepare({SCALE_MONTHS})")
        t0 = time.perf_counter()
        results["fill"] = scale_fill(url, args.scale_rows, args.scale_hot_share, args.scale_fill_minutes)
        psql(empty_url, "SELECT bench_scale.finish()")
        results["fill"]["total_s"] = time.perf_counter() - t0
        results["fill"]["vacuum_s"], _ = timed_psql(url, "VACUUM ANALYZE")
        psql(empty_url, "VACUUM ANALYZE")
        psql(url, "CHECKPOINT")
        log(f"fill: done in {results['fill']['total_s']:.0f} s, VACUUM ANALYZE {results['fill']['vacuum_s']:.0f} s")
        results["sizes"] = database_sizes(url)
        results["empty_size"] = int(psql(empty_url, "SELECT pg_database_size(current_database())"))
        first_month = psql(url, "SELECT to_char(min(month) AT TIME ZONE 'UTC', 'YYYY-MM') FROM bench_scale.progress")
        hot = psql(url, "SELECT bench_scale.company(0)")
        hot_rows = psql(url, "SELECT used FROM company_usage c JOIN plan_periods p ON p.company_id = c.company_id AND p.id = c.period_id "
                             "WHERE c.company_id = bench_scale.company(0) AND p.started_at <= now() AND p.ends_at > now()")
        results["hot"] = (hot, int(hot_rows))

        many_keys = os.path.join(WORK, "keys_many.txt")
        hot_keys = os.path.join(WORK, "keys_hot.txt")
        with open(many_keys, "w") as f:
            f.writelines(f"cg_bench_c{i}_u{j}\n" for i in range(1, 1001) for j in range(1, 11))
        with open(hot_keys, "w") as f:
            f.writelines(f"cg_bench_hot_u{j}\n" for j in range(1, 641))
        mock_port = free_port()
        start("mock", [BIN, "mock", "--port", str(mock_port), "--lean"])
        wait_http(f"http://127.0.0.1:{mock_port}/v1/models")
        direct = f"http://127.0.0.1:{mock_port}"
        gateways = {}
        for label, u in (("empty", empty_url), ("filled", url)):
            port = free_port()
            start(f"gateway-{label}", [BIN, "serve"], env={
                "DATABASE_URL": u, "UPSTREAM_URL": direct, "OPERATOR_TOKEN": OPERATOR, "HTTP_PORT": str(port),
                "LOG_LEVEL": "warning", "DATABASE_MAX_CONNECTIONS": "16", "DATABASE_DURABILITY": "durable"})
            wait_http(f"http://127.0.0.1:{port}/readyz")
            gateways[label] = f"http://127.0.0.1:{port}"
        for label in ("empty", "filled"):
            wrk(gateways[label], 64, args.warmup, many_keys)
            wrk(gateways[label], 64, max(1, args.warmup // 4), hot_keys)
        for u in (url, empty_url):
            psql(u, "VACUUM ANALYZE plan_periods, company_usage, user_usage, usage_rollups, usage_rollup_changes")
        psql(url, "CHECKPOINT")

        # Admission, empty and filled alternating (ABBA), with a direct run per repeat.
        results["admission"] = []
        for name, c, keys in [("many companies", 1, many_keys), ("many companies", 64, many_keys), ("one hot company", 64, hot_keys)]:
            ds, runs = [], {"empty": [], "filled": []}
            for i in range(args.repeats):
                ds.append(wrk(direct, c, args.seconds, None, per_call=c == 1))
                for label in (("empty", "filled") if i % 2 == 0 else ("filled", "empty")):
                    runs[label].append(wrk(gateways[label], c, args.seconds, keys, per_call=c == 1))
            row = {"scenario": name, "c": c, "direct": median_run(ds), "empty": median_run(runs["empty"]),
                   "filled": median_run(runs["filled"]), "ratios": [b["rps"] / a["rps"] for a, b in zip(runs["empty"], runs["filled"])]}
            if c == 1:
                row["added"] = {label: [r["calls"]["p50_ms"] - d["calls"]["p50_ms"] for r, d in zip(runs[label], ds)] for label in runs}
            results["admission"].append(row)
            log(f"{name:16} c={c:<3} empty {row['empty']['rps']:7.0f} rps, filled {row['filled']['rps']:7.0f} rps, ratios "
                + " / ".join(f"{x:.3f}" for x in row["ratios"])
                + (f"; added p50 empty {median(row['added']['empty']):.3f} ms, filled {median(row['added']['filled']):.3f} ms" if c == 1 else ""))
        # The filled ledger is verified once, at the end (a pass over every row and rollup).
        ok, line = verify(empty_url)
        results["verify"].append(("empty, after the admission runs", ok, line))

        # The reads of the biggest company, as the operator: the usage object and the console's
        # daily chart (the current period, and the 12 months), each `--scale-reads` times.
        since = psql(url, f"SELECT to_char(min(m) AT TIME ZONE 'UTC', 'YYYY-MM-DD') FROM bench_scale.months({SCALE_MONTHS}) m")
        today = time.strftime("%Y-%m-%d", time.gmtime())
        results["reads"] = []
        for label_path, path in [("admin usage", f"/admin/v1/companies/{hot}/usage"),
                                 ("daily chart, current period", f"/admin/v1/companies/{hot}/usage/daily"),
                                 ("daily chart, 12 months", f"/admin/v1/companies/{hot}/usage/daily?from={since}&to={today}"),
                                 ("per-model usage, current period", f"/admin/v1/companies/{hot}/usage/models")]:
            row = {"read": label_path, "path": path}
            for label in ("empty", "filled"):
                row[label] = read_latency(gateways[label], path, args.scale_reads)
            results["reads"].append(row)
            log(f"read {label_path:32} p50 empty {row['empty']['p50_ms']:.2f} ms, filled {row['filled']['p50_ms']:.2f} ms "
                f"(p99 {row['filled']['p99_ms']:.2f}, {row['filled']['bytes']} bytes)")
        # The /metrics job's read of the unsettled charges (every 5 minutes in every gateway).
        results["unsettled_s"], _ = timed_psql(url, "SELECT count(*), min(created_at) FROM usage_ledger WHERE outcome = 'charged' "
                                                    "AND settled_at IS NULL AND created_at <= clock_timestamp() - interval '1 hour'")
        log(f"the unsettled read of /metrics: {results['unsettled_s']:.1f} s")

        # Rollover of every company into the next month, as `capgate rollover` at its first second.
        at = psql(url, "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + interval '1 month 1 second', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
        results["rollover"] = {}
        for label, u in (("empty", empty_url), ("filled", url)):
            seconds, out, _, _ = run_sampled([BIN, "rollover", "--at", at], {"DATABASE_URL": u})
            results["rollover"][label] = (seconds, out.splitlines()[-1] if out else "")
            log(f"rollover {label}: {seconds:.2f} s ({results['rollover'][label][1]})")

        # The oldest month: exported (rows/s, the exporter's RSS), then dropped.
        export = os.path.join(WORK, f"ledger-{first_month}.jsonl")
        month_rows = int(psql(url, f"SELECT count(*) FROM usage_ledger_p{first_month.replace('-', '')}"))
        seconds, out, peak, samples = run_sampled([BIN, "ledger", "export", "--month", first_month, "--to", export], {"DATABASE_URL": url})
        quarter = [samples[min(len(samples) - 1, len(samples) * k // 4)] for k in (1, 2, 3, 4)] if samples else []
        results["export"] = {"month": first_month, "rows": month_rows, "seconds": seconds, "peak_kb": peak, "rss_kb": quarter,
                             "bytes": os.path.getsize(export), "line": out.splitlines()[-1]}
        log(f"export {first_month}: {month_rows:,} rows in {seconds:.1f} s ({month_rows / seconds:,.0f} rows/s), "
            f"{os.path.getsize(export) / 2**20:.0f} MiB, peak RSS {peak / 1024:.1f} MiB, RSS at each quarter "
            + " / ".join(f"{x / 1024:.1f}" for x in quarter) + " MiB")
        # The retention that lets the month go: one month less than its age (the current month is 0).
        age = int(psql(url, f"SELECT (extract(year FROM now() AT TIME ZONE 'UTC') * 12 + extract(month FROM now() AT TIME ZONE 'UTC'))::int "
                            f"- (extract(year FROM date '{first_month}-01') * 12 + extract(month FROM date '{first_month}-01'))::int"))
        seconds, out, _, _ = run_sampled([BIN, "ledger", "drop", "--month", first_month],
                                         {"DATABASE_URL": url, "LEDGER_RETENTION_MONTHS": str(max(1, age - 1))})
        results["drop"] = {"month": first_month, "seconds": seconds, "line": out.splitlines()[-1]}
        log(f"drop {first_month}: {seconds:.1f} s ({results['drop']['line']})")
        os.remove(export)
        results["size_after_drop"] = int(psql(url, "SELECT pg_database_size(current_database())"))
        for label, u in (("empty", empty_url), ("filled", url)):
            t0 = time.perf_counter()
            ok, line = verify(u)
            results["verify"].append((f"{label}, at the end (after the rollover{', export and drop' if label == 'filled' else ''})", ok, line))
            results["verify_s"] = time.perf_counter() - t0
            log(f"verify {label}: {'ok' if ok else 'MISMATCH'} in {results['verify_s']:.0f} s ({line})")
        if args.pause:
            # For EXPLAIN ANALYZE by hand on the filled database; `touch WORK/continue` ends it early.
            log(f"stack up: gateways {gateways}, database {url}; pausing {args.pause} s (touch {WORK}/continue to stop)")
            deadline = time.time() + args.pause
            while time.time() < deadline and not os.path.exists(os.path.join(WORK, "continue")):
                time.sleep(1)
    finally:
        stop_all()
    write_scale_report(args, results, settings)


def write_scale_report(args, results, settings):
    fill = results.get("fill", {})
    lines = ["## The ledger at scale (`bench.py --scale`)", "",
             f"Measured on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {machine()}.",
             "PostgreSQL 15 (embedded launcher), " + ", ".join(f"`{k}={v}`" for k, v in settings.items()) + ".",
             f"Two databases on that server: `capgate_empty` (the seed only) and `capgate` (the seed and {fill.get('rows', 0):,} ledger rows over "
             f"{SCALE_MONTHS} UTC months, `bench/ledger_scale.sql`), each with its own gateway (release build, durable, pool of 16) on one lean mock provider.", ""]
    if fill:
        lines += [f"Fill: {fill['rows']:,} rows in {fill['fill_s']:.0f} s ({fill['rows'] / max(fill['fill_s'], 1e-9):,.0f} rows/s, rollup triggers on), "
                  f"rollups compacted in {fill['compact_s']:.0f} s, counters set in {fill['counters_s']:.0f} s, VACUUM ANALYZE {fill['vacuum_s']:.0f} s"
                  + (f"; {fill['stopped']}" if fill.get("stopped") else "") + ".", ""]
    if results.get("hot"):
        lines += [f"The biggest company (`bench hot`, {args.scale_hot_share:.0%} of the rows) has {results['hot'][1]:,} calls in the current period.", ""]
    t = SCALE_TARGETS
    lines += ["| measure | empty ledger | filled ledger | filled / empty | target | met |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for row in results.get("admission", []):
        ratio = median(row["ratios"])
        lines.append(f"| {row['scenario']}, c={row['c']}, requests/s (median run; every pair's ratio "
                     + " / ".join(f"{x:.2f}" for x in row["ratios"]) + f") | {row['empty']['rps']:.0f} | {row['filled']['rps']:.0f} | {ratio:.3f} | "
                     + ("within 10 % | " + ("yes" if ratio >= 1 - t["rps"] else "no") if row["c"] == 64 else "— | —") + " |")
        if "added" in row:
            e, f = median(row["added"]["empty"]), median(row["added"]["filled"])
            lines.append(f"| {row['scenario']}, c=1, added p50 ms (median of runs "
                         + " / ".join(f"{x:.2f}" for x in row["added"]["filled"]) + f") | {e:.3f} | {f:.3f} | {f / e:.3f} | within 10 % | "
                         + ("yes" if f <= e * (1 + t["added_p50"]) else "no") + " |")
    for row in results.get("reads", []):
        e, f = row["empty"]["p50_ms"], row["filled"]["p50_ms"]
        lines.append(f"| {row['read']} of the biggest company, p50 ms ({args.scale_reads} reads; filled p99 {row['filled']['p99_ms']:.1f}) | "
                     f"{e:.2f} | {f:.2f} | {f / e:.2f} | ≤ 50 ms | " + ("yes" if f <= t["read_ms"] else "no") + " |")
    if results.get("rollover"):
        e, f = results["rollover"]["empty"][0], results["rollover"]["filled"][0]
        lines.append(f"| `capgate rollover` of 1,001 companies, s | {e:.2f} | {f:.2f} | {f / e:.2f} | ≤ 10 s | " + ("yes" if f <= t["rollover_s"] else "no") + " |")
    if results.get("export"):
        x = results["export"]
        rate = x["rows"] / x["seconds"]
        lines.append(f"| `capgate ledger export` of {x['month']} ({x['rows']:,} rows, {x['bytes'] / 2**20:,.0f} MiB JSON lines), rows/s | — | {rate:,.0f} | — | ≥ 200,000 | "
                     + ("yes" if rate >= t["export_rows_s"] else "no") + " |")
        lines.append(f"| the export's RSS, MiB: peak; at each quarter of its run | — | {x['peak_kb'] / 1024:.1f}; "
                     + " / ".join(f"{k / 1024:.1f}" for k in x["rss_kb"]) + " | — | flat | " + ("yes" if x["rss_kb"] and max(x["rss_kb"]) - min(x["rss_kb"]) < 16 * 1024 else "no") + " |")
    if results.get("drop"):
        lines.append(f"| `capgate ledger drop --month {results['drop']['month']}`, s | — | {results['drop']['seconds']:.1f} | — | — | — |")
    if results.get("sizes"):
        total, parts = results["sizes"]
        lines.append(f"| database size, GiB | {results['empty_size'] / 2**30:.2f} | {total / 2**30:.2f} | — | — | — |")
        if results.get("size_after_drop"):
            lines.append(f"| database size after the drop, GiB | — | {results['size_after_drop'] / 2**30:.2f} | — | — | — |")
    if "verify_s" in results:
        lines.append(f"| `capgate verify` of the filled database (after the drop), s | — | {results['verify_s']:.0f} | — | — | — |")
    if "unsettled_s" in results:
        lines.append(f"| the `/metrics` job's unsettled read (every 5 min in every gateway), s | — | {results['unsettled_s']:.1f} | — | — | — |")
    if results.get("sizes"):
        lines += ["", "| relation | rows (estimate) | table MiB | with indexes MiB |", "| --- | ---: | ---: | ---: |"]
        lines += [f"| `{name}` | {n:,} | {heap / 2**20:,.0f} | {total / 2**20:,.0f} |" for name, total, heap, n in results["sizes"][1]]
    lines += ["", "`capgate verify`:", ""] + [f"- {name}: {'ok' if ok else 'MISMATCH'} ({line})" for name, ok, line in results["verify"]]
    if results.get("rollover"):
        lines += [f"- rollover {label}: {line}" for label, (_, line) in results["rollover"].items()]
    if results.get("drop"):
        lines.append(f"- drop: {results['drop']['line']}")
    lines.append("")
    with open(args.output, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


class WebhookSink:
    """A webhook receiver on loopback that answers 204 to every POST and counts them."""

    def __init__(self):
        import http.server
        import threading
        sink = self
        self.count = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", "0")))
                sink.count += 1
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()


def machine():
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024 // 1024
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores ({cpu}), {mem} GiB, {platform.system()} {platform.release()}"


def write_report(args, results, settings):
    lines = ["# CapGate benchmarks", "",
             f"Measured by `bench/run` on {time.strftime('%Y-%m-%d')}: {machine()}.",
             "PostgreSQL 15 (embedded launcher), " + ", ".join(f"`{k}={v}`" for k, v in settings.items()) + ".",
             f"Admission durability: `{args.durability}` (rows marked relaxed: a second gateway with `database.durability = relaxed`). Gateway: release build, `LOG_LEVEL=warning` (except the row marked info: one log line per request to a file), pool of 16 connections.",
             ("Route table and features: `bench/features.sql` (every metered call charges the feature `analysis`: company, user and four feature counters). " if args.features else "Caps only: no routes, no features. ") +
             ("Cost budgets: `bench/budgets.sql` (every call priced, held against a company and a user budget and settled from its usage). " if args.budgets else "") +
             ("Rate windows: `bench/rate.sql` (every call counted in the company's and the user's minute windows, holding a concurrency slot and its tokens until its end). " if args.rate else "") +
             ("Call windows: `bench/rate-rpm.sql` (every call counted in the company's and the user's minute call windows). " if args.rate_rpm else "") +
             ("Threshold notifications on: a webhook receiver on loopback, the gateway's deliverer sending a backlog of pending rows during the runs"
              + (f" ({results['notifications']}). " if results.get("notifications") else ". ") if args.notifications else "") +
             f"Provider: `capgate mock{' --lean' if args.provider == 'lean' else ''}` ({'the Messages API on plain SwiftNIO handlers' if args.provider == 'lean' else 'the Hummingbird mock the tests use'}).",
             "Load: wrk from a separate process on the same 2 cores (wrk, the mock provider, CapGate and PostgreSQL share them),",
             f"{args.seconds} s per run, non-streaming `POST /v1/messages` unless noted, keys rotated per request. After {args.warmup} s of warm-up load on each",
             f"gateway, a `VACUUM ANALYZE` and a `CHECKPOINT`, each scenario runs {args.repeats} times, direct and through CapGate alternating; the run with the median",
             "requests/s is reported, and the CapGate rps column lists every run (this machine's cores are shared: runs of one setting vary by ±15 %).", "",
             "## Through CapGate vs the provider directly", "",
             "| scenario | conc. | direct rps | CapGate rps | ratio | direct p50 ms | CapGate p50 ms | added p50 ms | direct p99 ms | CapGate p99 ms | added p99 ms | non-2xx | CapGate rps, every run |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in results["wrk"]:
        d, g = r["direct"], r["capgate"]
        lines.append(f"| {r['scenario']} | {r['c']} | {d['rps']:.0f} | {g['rps']:.0f} | {g['rps'] / d['rps']:.3f} | {d['p50_ms']:.3f} | {g['p50_ms']:.3f} | "
                     f"{g['p50_ms'] - d['p50_ms']:.3f} | {d['p99_ms']:.3f} | {g['p99_ms']:.3f} | {g['p99_ms'] - d['p99_ms']:.3f} | {g['non2xx']} | "
                     + " / ".join(f"{x:.0f}" for x in g.get("all_rps", [g["rps"]])) + " |")
    if results["ab"]:
        lines += ["", f"## {args.ab} against caps only, alternating in one stack", "",
                  f"Each repeat runs caps only and `{args.ab}` back to back on the same gateway and database (order swapped every",
                  "repeat); a pair's ratio is its two runs' requests/s, its added p50 the difference of their call-by-call p50.",
                  "The interval is the geometric mean ratio's 95 % interval (Student's t over the pairs' log ratios): two builds",
                  "whose intervals overlap widely are not told apart by this many pairs.", "",
                  "| scenario | conc. | median ratio | geometric mean (95 % interval) | every pair's ratio | median added p50 ms (c=1) | every pair's added p50 ms |",
                  "| --- | ---: | ---: | ---: | --- | ---: | --- |"]
        for r in results["ab"]:
            added = r["added_p50"]
            mean, lo, hi = ratio_interval(r["ratios"])
            lines.append(f"| {r['scenario']} | {r['c']} | {median(r['ratios']):.3f} | {mean:.3f} ({lo:.3f}–{hi:.3f}) | "
                         + " / ".join(f"{x:.3f}" for x in r["ratios"]) + " | "
                         + (f"{median(added):+.3f} | " + " / ".join(f"{x:+.3f}" for x in added) if added else "— | —") + " |")
    sized = [r for r in results["wrk"] if "body_bytes" in r]
    if sized:
        lines += ["", "## Real-sized bodies: the gateway's memory", "",
                  "The gateway's peak RSS (VmHWM: the most it ever held) after each size's runs, smallest size first, against its peak",
                  "after the warm-up with one-line bodies. At c=64, 64 bodies are in flight at once: a reader that kept several copies",
                  "of each body would grow by a multiple of 64 × the body size.", "",
                  "| scenario | conc. | body bytes | peak RSS MiB | growth over the warm-up's peak MiB | growth / (concurrency × body) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in sized:
            growth = (r["peak_kb"] - r["peak_before_kb"]) * 1024
            lines.append(f"| {r['scenario']} | {r['c']} | {r['body_bytes']} | {r['peak_kb'] / 1024:.1f} | {growth / 2**20:.1f} | "
                         f"{growth / (r['c'] * r['body_bytes']):.2f} |")
    if results["reader"]:
        lines += ["", "## The body reader against JSONSerialization (`capgate bench-reader`, one process, 2 s each)", "",
                  "`capgate-call-body` is what every metered call runs (the whole body checked as I-JSON, `model` and `max_tokens` built);",
                  "`capgate-prompt-shape` the second pass a call makes when a budget or a token window applies; `capgate-whole-tree`",
                  "builds every value; Foundation's `JSONSerialization` builds every value too, and checks less (it takes repeated",
                  "names and lone surrogates, which CapGate refuses).", "",
                  "| body bytes | reader | MB/s | × JSONSerialization |", "| ---: | --- | ---: | ---: |"]
        base = {b: mbps for name, b, mbps in results["reader"] if name == "foundation-jsonserialization"}
        for name, b, mbps in results["reader"]:
            lines.append(f"| {b} | {name} | {mbps:.1f} | {mbps / base[b]:.2f} |" if base.get(b) else f"| {b} | {name} | {mbps:.1f} | — |")
    per_call = [r for r in results["wrk"] if "calls" in r["capgate"]]
    if per_call:
        lines += ["", "## Concurrency 1, call by call", "",
                  "wrk corrects its percentiles (the table above) for coordinated omission: for every call slower than twice the mean",
                  "interval between calls (about 1 ms through CapGate at concurrency 1), it adds samples as if calls had kept arriving",
                  "at the mean rate, so one 70 ms stall adds about 70 samples to some 9,000 and alone can move the p99 past 20 ms. Here",
                  "are the same runs' calls as measured (`bench/messages.lua` with `LATENCY_FILE`, monotonic clock), and the stalls of",
                  "the disk meanwhile: a probe beside the database writes and `fdatasync`s 4 KiB every 20 ms, counting syncs over 20 ms.", "",
                  "| scenario | direct p50 ms | direct p99 ms | CapGate p50 ms | CapGate p99 ms | added p50 ms | added p99 ms | CapGate slowest call ms | CapGate calls > 20 ms | disk syncs > 20 ms during the CapGate run | CapGate added p99 ms, every run (disk syncs > 20 ms) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for r in per_call:
            d, g = r["direct"]["calls"], r["capgate"]["calls"]
            stalls = ", ".join(f"{x}" for x in g["disk_stalls_ms"]) or "none"
            every = " / ".join(f"{run['p99_ms'] - d['p99_ms']:.3f} ({len(run['disk_stalls_ms'])})" for run in r["capgate"]["all_calls"])
            lines.append(f"| {r['scenario']} | {d['p50_ms']:.3f} | {d['p99_ms']:.3f} | {g['p50_ms']:.3f} | {g['p99_ms']:.3f} | "
                         f"{g['p50_ms'] - d['p50_ms']:.3f} | {g['p99_ms'] - d['p99_ms']:.3f} | {g['max_ms']:.1f} | {g['over_20ms']} | "
                         f"{len(g['disk_stalls_ms'])}{' (ms: ' + stalls + ')' if g['disk_stalls_ms'] else ''} | {every} |")
    lines += ["", "Counters equal the ledger after every scenario (`capgate verify`):", ""]
    lines += [f"- {name}: {'ok' if ok else 'MISMATCH'} ({line})" for name, ok, line in results["verify"]]
    lines += ["", "## Admission alone, one call per transaction (pgbench, `capgate_admit`: what a lone call on an idle gateway runs)", "",
              "| workload | clients | tps | avg latency ms |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {label} | {c} | {tps:.0f} | {lat} |" for label, c, tps, lat in results["pgbench"]]
    if results["batched"]:
        lines += ["", "## Batched admission alone (pgbench, 32 calls per `capgate_admit_batch` transaction)", "",
                  "One client is one gateway (one batch in flight at a time); 8 clients are 8 gateways on one database.", "",
                  "| workload | clients | batches/s | admissions/s | avg latency ms a batch |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {label} | {c} | {tps:.0f} | {tps * 32:.0f} | {lat} |" for label, c, tps, lat in results["batched"]]
    lines += ["", "## Admission cost against ledger size (1 client)", "",
              "| ledger rows in the period | CapGate admission tps | seed design COUNT(*) + INSERT tps | seed design latency ms |",
              "| ---: | ---: | ---: | ---: |"]
    lines += [f"| {rows:,} | {c:.0f} | {s:.1f} | {lat} |" for rows, c, s, lat in results["ledger"]]
    if results["soak"]:
        lines += ["", "## Soak (concurrency 64): gateway RSS", "", "| seconds | RSS MiB |", "| ---: | ---: |"]
        lines += [f"| {t} | {kb / 1024:.1f} |" for t, kb in results["soak"]]
    notes = os.path.join(BENCH, "notes.md")
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    lines.append("")
    with open(args.output, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
