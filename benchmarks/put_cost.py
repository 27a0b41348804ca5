"""What a put costs (issue 14's throughput targets), this tree beside another one.

Three measurements, each in a child process, on this tree and on ``--baseline`` (a
checkout of another commit with its extension built in place), in alternating order,
round after round, with a ceiling or a baseline for each measured in the same rounds
(``--only`` picks some of them):

* ``put``: ``--records`` single-record puts (100-byte bodies, async flush) in a Python
  loop, as an embedding service makes them. Reported as records per second of the
  writing thread's CPU time (``time.thread_time``) and of wall time. Ceiling: the same
  loop calling ``mmap.write`` of a 169-byte record into a file's pages touched before
  (the least a Python-level put per record can cost here).
* ``sync``: ``--threads`` threads each making ``--per-thread`` sync-flush puts (group
  commit); acknowledged records per second of the process's CPU time
  (``time.process_time``: every thread, the syncs' system time included) and of wall
  time, and records per fsync. Ceiling: the same number of threads passing a baton in a
  ring through this tree's ``Waiter`` (each hand-off wakes a sleeping thread, as each
  acknowledged put must), hand-offs per second.
* ``durable``: ``--batches`` durable ``put_batch`` calls of 1000 records (100-byte
  bodies, ``flush_mode="sync"``: each returns once its group commit is durable) on a new
  store, as compare.py's durable row makes them; records per second of wall time (a
  durable batch mostly waits for the disk) and of the process's CPU time. Baseline: the
  same records appended to a buffered file, length-prefixed, ``flush()`` +
  ``fdatasync`` per batch (compare.py's file peer).

On a shared machine the wall clock mostly measures the wait for a core (load averages of
10-18 here): the CPU-time rates and the ratios of one run are what to compare. The load
average is printed with the figures.

    python -m benchmarks.put_cost --baseline /tmp/main-checkout --rounds 5
    python -m benchmarks.put_cost --baseline /tmp/old --only durable --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

PUT = r"""
import json, sys, time
import mqlog
path, records = sys.argv[1], int(sys.argv[2])
store = mqlog.open(path, segment_size_bytes=1 << 30)
body = b"m" * 100
def loop(put=store.put, body=body, count=records):
    for _ in range(count):
        put("bench", body)
loop(count=20_000)  # the first pages and the queue: not what is measured
cpu, wall = time.thread_time(), time.perf_counter()
loop()
cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
store.close()
print(json.dumps({"cpu": records / cpu, "wall": records / wall}))
"""

PUT_CEILING = r"""
import json, mmap, os, sys, time
path, records = sys.argv[1], int(sys.argv[2])
record = b"h" * 64 + b"bench" + b"m" * 100
size = (records + 1) * len(record) + (1 << 20)
fd = os.open(os.path.join(path, "file"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, size)
mapped = mmap.mmap(fd, size)
for offset in range(0, size, 4096):  # mqlog's pages are prepared ahead too
    mapped[offset] = 0
def loop(write=mapped.write, record=record, count=records):
    for _ in range(count):
        write(record)
cpu, wall = time.thread_time(), time.perf_counter()
loop()
cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu": records / cpu, "wall": records / wall}))
"""

SYNC = r"""
import json, sys, threading, time
import mqlog
path, threads, per_thread = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = mqlog.open(path, flush_mode="sync", segment_size_bytes=1 << 30)
body = b"m" * 100
def produce(worker):
    for _ in range(per_thread):
        store.put("bench", body, queue_id=worker % 16)
workers = [threading.Thread(target=produce, args=(w,)) for w in range(threads)]
cpu, wall = time.process_time(), time.perf_counter()
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
count = threads * per_thread
syncs = max(1, store.flush_count)
store.close()
print(json.dumps({"cpu": count / cpu, "wall": count / wall, "per_fsync": count / syncs}))
"""

SYNC_CEILING = r"""
import json, sys, threading, time
from mqlog import ext
threads, rounds = int(sys.argv[2]), int(sys.argv[3])
Waiter = ext.core.Waiter
slots = [Waiter() for _ in range(threads)]  # slots[i]: what thread i sleeps on
def run(index):
    slots[index].wait(-1)
    for turn in range(rounds):
        following = slots[(index + 1) % threads]
        if turn == rounds - 1:
            following.wake()
            return
        mine = slots[index] = Waiter()
        mine.wait(-1, following)  # wake the next as this one sleeps (wake-on-block)
workers = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
for worker in workers:
    worker.start()
cpu, wall = time.process_time(), time.perf_counter()
slots[0].wake()
for worker in workers:
    worker.join()
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
count = threads * rounds
print(json.dumps({"cpu": count / cpu, "wall": count / wall}))
"""


DURABLE = r"""
import json, sys, time
import mqlog
path, batches = sys.argv[1], int(sys.argv[2])
store = mqlog.open(path, flush_mode="sync", segment_size_bytes=256 << 20)
bodies = [b"m" * 100] * 1000
store.put_batch("bench", bodies)  # the queue and the first pages: not what is measured
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(batches):
    store.put_batch("bench", bodies)
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
store.close()
print(json.dumps({"cpu": batches * 1000 / cpu, "wall": batches * 1000 / wall}))
"""

DURABLE_FILE = r"""
import json, os, struct, sys, time
path, batches = sys.argv[1], int(sys.argv[2])
bodies = [b"m" * 100] * 1000
pack = struct.Struct("<I").pack
with open(os.path.join(path, "log"), "wb") as file:
    write = file.write
    def batch():
        for body in bodies:
            write(pack(len(body)))
            write(body)
        file.flush()
        os.fdatasync(file.fileno())
    batch()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(batches):
        batch()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu": batches * 1000 / cpu, "wall": batches * 1000 / wall}))
"""

MEASURES = ("put", "sync", "durable")


def child(code: str, tree: Path | None, work: Path, *arguments: object) -> dict[str, float]:
    """Run ``code`` on ``tree`` (None: this tree) in a fresh directory; its JSON line."""
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        env = dict(os.environ, PYTHONPATH=str(tree or HERE))
        out = subprocess.run([sys.executable, "-c", code, scratch, *map(str, arguments)],
                             env=env, check=True, capture_output=True, text=True,
                             cwd=scratch).stdout
    return json.loads(out.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.put_cost")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="another checkout of mqlog, its extension built in place")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=256)
    parser.add_argument("--per-thread", type=int, default=100)
    parser.add_argument("--batches", type=int, default=200,
                        help="durable put_batch calls of 1000 records per child")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=",".join(MEASURES),
                        help=f"comma-separated subset of {','.join(MEASURES)}")
    args = parser.parse_args(argv)
    only = [name.strip() for name in args.only.split(",") if name.strip()]
    if not only or set(only) - set(MEASURES):
        parser.error(f"--only takes a subset of {','.join(MEASURES)}")
    work = Path(tempfile.mkdtemp(prefix="mqlog-put-cost-",
                                 dir=os.environ.get("MQLOG_BENCH_DIR")))
    rows: dict[str, list[dict[str, float]]] = {}
    loads = [os.getloadavg()[0]]
    for round_index in range(args.rounds):
        trees = [None, args.baseline][::1 if round_index % 2 == 0 else -1]
        plan = {"put": (PUT, (args.records,), "ceiling (mmap.write)", PUT_CEILING),
                "sync": (SYNC, (args.threads, args.per_thread), "ceiling (Waiter ring)",
                         SYNC_CEILING),
                "durable": (DURABLE, (args.batches,), "file + fdatasync", DURABLE_FILE)}
        for kind in only:
            code, arguments, other, other_code = plan[kind]
            for tree in trees:
                name = "this tree" if tree is None else "baseline"
                rows.setdefault(f"{kind}, {name}", []).append(
                    child(code, tree, work, *arguments))
            rows.setdefault(f"{kind}, {other}", []).append(
                child(other_code, None, work, *arguments))
        loads.append(os.getloadavg()[0])
        print(f"round {round_index + 1} done (load {loads[-1]:.1f})", flush=True)
    os.rmdir(work)
    print(report(rows, loads))
    return 0


def report(rows: dict[str, list[dict[str, float]]], loads: list[float]) -> str:
    """One line a row: its medians, and the medians of its per-round ratios to the other
    tree's figure and (wall) to the ceiling or baseline measured in the same round."""
    lines = [f"load average {min(loads):.1f}-{max(loads):.1f}; medians of "
             f"{len(next(iter(rows.values())))} rounds, ratios per round",
             "| row | CPU-time rate | wall rate | CPU ratio to baseline | wall ratio "
             "| wall ratio to the ceiling / file |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, figures in rows.items():
        kind = name.split(",")[0]
        base = rows[f"{kind}, baseline"]
        other = next(figures for row, figures in rows.items()
                     if row.startswith(f"{kind},") and "this tree" not in row
                     and "baseline" not in row)
        extra = ""
        if "per_fsync" in figures[0]:
            extra = f" ({statistics.median(f['per_fsync'] for f in figures):.0f}/fsync)"
        lines.append(f"| {name}{extra} | {_rate(figures, 'cpu')} | {_rate(figures, 'wall')} "
                     f"| {_ratio(figures, base, 'cpu')} | {_ratio(figures, base, 'wall')} "
                     f"| {_ratio(figures, other, 'wall')} |")
    return "\n".join(lines)


def _ratio(figures: list[dict[str, float]], base: list[dict[str, float]], key: str) -> str:
    ratios = [f[key] / b[key] for f, b in zip(figures, base, strict=True)]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _rate(figures: list[dict[str, float]], key: str) -> str:
    value = statistics.median(figure[key] for figure in figures)
    return f"{value / 1e6:.2f} M/s" if value >= 1e5 else f"{value / 1e3:.1f} k/s"


if __name__ == "__main__":
    raise SystemExit(main())
