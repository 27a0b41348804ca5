"""Side-by-side figures for the engine, each beside a baseline measured in the same run.

Every measurement runs in rounds, interleaved with its baseline (mqlog, baseline, mqlog,
baseline...), because this machine is shared and noisy: only ratios measured together
mean anything. For each row the table gives min / median / max records/s over rounds
and the median of the per-round ratios to the baseline, and says whether the issue's
target is met.

    python -m benchmarks.compare            # the full table (a few minutes)
    python -m benchmarks.compare --quick    # tiny sizes: a smoke run (seconds)

Rows (100-byte bodies):
* put, one record per call — baseline: buffered file append of length-prefixed records
* put_batch of 1000 — baseline: LMDB putmulti(append=True) in batches of 1000
* get in batches of 1000, touching each body — baseline: an LMDB cursor over the same
* sync flush, 256 concurrent producers (threads; and asyncio tasks) — baseline: 4 KiB
  append + fdatasync per record from one thread (what a durable write costs alone)
* durable put_batch of 1000 (``flush_mode="sync"``) — baselines: a buffered file with
  ``fdatasync`` per batch, and LMDB ``sync=True`` (a row each, same mqlog figures)
* sync-flush tail latency: p99.9 ack latency of 16 and 64 asyncio tasks awaiting
  ``put_async`` after each task's first put — baseline: p99.9 of a lone 4 KiB append +
  ``fdatasync`` (lower is better); the first round of the new store is its own figure
* recovery scan after a crash — reported in GB/s of log, baseline: reading the same
  segment files with read()

After those rows come the comparison sweeps of ``benchmarks/sweeps.py`` (peers, message
size, queue count, sync-flush latency), each with its own baseline from the same rounds.
The whole report goes to stdout and to ``<out>/results.md``; each sweep draws
``<out>/<sweep>.png``. ``--only rows,peers,...`` runs a subset, and a subset (or a
``--quick`` run) writes ``<out>/results-<parts>[-quick].md`` instead, with its plots
beside it as ``<out>/results-<parts>[-quick]-<sweep>.png``, so a partial run never
overwrites the full sweep's page or its plots.

    python -m benchmarks.compare --out docs/bench     # everything (the default out)
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import os
import platform
import shutil
import statistics
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mqlog
from benchmarks import sweeps

BODY = b"m" * 100


@dataclass
class Sizes:
    records: int = 1_000_000
    durable_records: int = 200_000
    latency_tasks: tuple[int, ...] = (16, 64)
    producers: int = 256
    per_producer: int = 200
    scan_bytes: int = 512 << 20
    rounds: int = 5
    segment_size_bytes: int = 1 << 30


QUICK = Sizes(records=20_000, durable_records=5_000, producers=16, per_producer=20,
              scan_bytes=8 << 20, rounds=2, segment_size_bytes=16 << 20)


@dataclass
class Row:
    name: str
    unit: str
    target: str
    target_check: Callable[[float, float], bool]  # (median value, median ratio) -> met
    values: list[float] = field(default_factory=list)
    baselines: list[float] = field(default_factory=list)
    note: str = ""
    fmt: Callable[[float], str] = field(default=lambda value: _fmt(value))

    def add(self, value: float, baseline: float) -> None:
        self.values.append(value)
        self.baselines.append(baseline)

    def cells(self) -> list[str]:
        ratios = [v / b for v, b in zip(self.values, self.baselines, strict=True) if b]
        median, ratio = statistics.median(self.values), statistics.median(ratios)
        met = "yes" if self.target_check(median, ratio) else "**no**"
        fmt = self.fmt
        return [self.name, fmt(min(self.values)), fmt(median), fmt(max(self.values)),
                fmt(statistics.median(self.baselines)), f"{ratio:.2f}x", self.target, met]


def _fmt(value: float) -> str:
    return f"{value / 1e6:.2f} M" if value >= 1e5 else f"{value / 1e3:.1f} k"


def _store(root: Path, sizes: Sizes, **overrides: object) -> mqlog.Store:
    shutil.rmtree(root, ignore_errors=True)
    settings: dict[str, object] = {"segment_size_bytes": sizes.segment_size_bytes, **overrides}
    return mqlog.open(root, **settings)  # type: ignore[arg-type]


def _timed(action: Callable[[], int]) -> float:
    started = time.perf_counter()
    count = action()
    return count / (time.perf_counter() - started)


# --- mqlog -------------------------------------------------------------------------------

def mqlog_put(root: Path, sizes: Sizes) -> float:
    with _store(root, sizes) as store:
        put = store.put

        def run() -> int:
            for _ in range(sizes.records):
                put("bench", BODY)
            return sizes.records
        return _timed(run)


def mqlog_put_batch(root: Path, sizes: Sizes) -> float:
    with _store(root, sizes) as store:
        bodies = [BODY] * 1000

        def run() -> int:
            for _ in range(sizes.records // 1000):
                store.put_batch("bench", bodies)
            return sizes.records // 1000 * 1000
        return _timed(run)


def mqlog_get(root: Path, sizes: Sizes) -> float:
    with _store(root, sizes) as store:
        bodies = [BODY] * 1000
        for _ in range(sizes.records // 1000):
            store.put_batch("bench", bodies)

        def run() -> int:
            offset = seen = 0
            while batch := store.get("bench", 0, offset, 1000, 1 << 24):
                for record in batch:
                    seen += len(record.body) > 0
                offset += len(batch)
            return seen
        return _timed(run)


def mqlog_sync_threads(root: Path, sizes: Sizes) -> tuple[float, float]:
    with _store(root, sizes, flush_mode="sync") as store:
        def produce(worker: int) -> None:
            for _ in range(sizes.per_producer):
                store.put("bench", BODY, queue_id=worker % 16)

        def run() -> int:
            workers = [threading.Thread(target=produce, args=(w,))
                       for w in range(sizes.producers)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            return sizes.producers * sizes.per_producer
        rate = _timed(run)
        return rate, sizes.producers * sizes.per_producer / max(1, store.flush_count)


def mqlog_sync_asyncio(root: Path, sizes: Sizes) -> tuple[float, float]:
    with _store(root, sizes, flush_mode="sync") as store:
        async def produce(worker: int) -> None:
            for _ in range(sizes.per_producer):
                await store.put_async("bench", BODY, queue_id=worker % 16)

        async def main() -> None:
            await asyncio.gather(*(produce(w) for w in range(sizes.producers)))

        def run() -> int:
            asyncio.run(main())
            return sizes.producers * sizes.per_producer
        rate = _timed(run)
        return rate, sizes.producers * sizes.per_producer / max(1, store.flush_count)


def mqlog_recovery(root: Path, sizes: Sizes) -> tuple[float, float]:
    """GB/s of a crash-recovery scan, and of read() over the same files (the baseline)."""
    with _store(root, sizes, segment_size_bytes=max(sizes.scan_bytes, 1 << 24)) as store:
        bodies = [BODY] * 1000
        while store.written_position < sizes.scan_bytes * 0.9:
            store.put_batch("bench", bodies, queue_id=store.written_position % 7)
        end = store.written_position
    (root / "abort").touch()
    (root / "checkpoint").unlink()  # as if no checkpoint was ever written: scan it all
    started = time.perf_counter()
    with mqlog.open(root, segment_size_bytes=max(sizes.scan_bytes, 1 << 24)) as store:
        assert store.recovery_report.end_position == end
        scan = store.recovery_report.scanned_bytes / (time.perf_counter() - started) / 1e9
    started = time.perf_counter()
    total = 0
    for path in sorted((root / "commitlog").iterdir()):
        with open(path, "rb", buffering=0) as file:
            while chunk := file.read(1 << 20):
                total += len(chunk)
                if total >= end:
                    break
    return scan, min(total, end) / (time.perf_counter() - started) / 1e9


def durable_batches(work: Path, sizes: Sizes) -> dict[str, float]:
    """rec/s of put_batch of 1000 made durable per batch: mqlog (sync flush), a buffered
    file (fdatasync per batch) and LMDB (sync=True), one after the other."""
    from benchmarks import peers

    figures = {}
    for name, cls in (("mqlog", peers.MqlogPeer), ("file", peers.FilePeer),
                      ("lmdb", peers.LmdbPeer)):
        if cls.missing():
            continue
        peer = cls.open(work / name, True)
        try:
            figures[name] = sweeps.write_batches(peer, sizes.durable_records, BODY)[1]
        finally:
            peer.close()
            shutil.rmtree(work / name, ignore_errors=True)
    return figures


def tail_latency(work: Path, sizes: Sizes) -> tuple[dict[int, tuple[float, float]], float]:
    """Per task count: p99.9 ack latency (s) of put_async under sync flush after the
    first round, and that first round's latency (a new store's cold start, see
    sweeps.ack_latencies); and the p99.9 of a lone 4 KiB append + fdatasync."""
    sweep = sweeps.SweepSizes(latency_acks=max(64, sizes.producers * 16),
                              segment_size_bytes=sizes.segment_size_bytes)
    floor, _rate = sweeps.fdatasync_latency(work / "fsync", max(200, sweep.latency_acks // 2))
    found = {}
    for tasks in sizes.latency_tasks:
        latencies, _acked, cold = sweeps.mqlog_latency(work / "latency", tasks, sweep)
        found[tasks] = (sweeps.percentile(latencies, 0.999), cold)
    shutil.rmtree(work / "fsync", ignore_errors=True)
    shutil.rmtree(work / "latency", ignore_errors=True)
    return found, sweeps.percentile(floor, 0.999)


# --- baselines -------------------------------------------------------------------------

def file_append(root: Path, sizes: Sizes) -> float:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    header = struct.Struct("<I")
    with open(root / "log", "wb") as file:
        write = file.write

        def run() -> int:
            for _ in range(sizes.records):
                write(header.pack(len(BODY)))
                write(BODY)
            file.flush()
            return sizes.records
        return _timed(run)


def _lmdb_env(root: Path, sizes: Sizes):
    import lmdb

    shutil.rmtree(root, ignore_errors=True)
    return lmdb.open(str(root), map_size=max(1 << 30, sizes.records * 400), sync=False,
                     writemap=False)


def lmdb_putmulti(root: Path, sizes: Sizes) -> float:
    env = _lmdb_env(root, sizes)

    def run() -> int:
        for batch in range(sizes.records // 1000):
            items = [((batch * 1000 + i).to_bytes(8, "big"), BODY) for i in range(1000)]
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(items, append=True)
        return sizes.records // 1000 * 1000
    try:
        return _timed(run)
    finally:
        env.close()


def lmdb_cursor(root: Path, sizes: Sizes) -> float:
    env = _lmdb_env(root, sizes)
    with env.begin(write=True) as txn:
        txn.cursor().putmulti([(i.to_bytes(8, "big"), BODY) for i in range(sizes.records)],
                              append=True)

    def run() -> int:
        seen = 0
        with env.begin() as txn:
            for _key, value in txn.cursor():
                seen += len(value) > 0
        return seen
    try:
        return _timed(run)
    finally:
        env.close()


def thread_handoff_ceiling(sizes: Sizes) -> float:
    """What CPython lets ``sizes.producers`` threads do at most, here and now: hand-offs a
    second of a ring in which each thread only waits for its lock and releases the
    next one's. A thread's sync put blocks and is woken at least once per record, so this
    bounds "sync put, N threads" however the store wakes its waiters (the GIL lets one
    thread run at a time; each hand-off is a futex wake and a GIL transfer)."""
    count = sizes.producers
    locks = [threading.Lock() for _ in range(count)]
    for lock in locks:
        lock.acquire()

    def relay(index: int) -> None:
        mine, following = locks[index], locks[(index + 1) % count]
        for _ in range(sizes.per_producer):
            mine.acquire()
            following.release()

    def run() -> int:
        relays = [threading.Thread(target=relay, args=(index,)) for index in range(count)]
        for thread in relays:
            thread.start()
        locks[0].release()
        for thread in relays:
            thread.join()
        return count * sizes.per_producer
    return _timed(run)


def fdatasync_each(root: Path, sizes: Sizes) -> float:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    fd = os.open(root / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block = bytes(4096)
    count = max(200, sizes.producers * sizes.per_producer // 20)

    def run() -> int:
        for _ in range(count):
            os.write(fd, block)
            os.fdatasync(fd)
        return count
    try:
        return _timed(run)
    finally:
        os.close(fd)


# --- the table ---------------------------------------------------------------------------

def _rows() -> dict[str, Row]:
    return {
        "put": Row("put, one record per call", "rec/s", ">= 1.5 M rec/s",
                   lambda value, ratio: value >= 1.5e6, note="baseline: buffered file append"),
        "put_batch": Row("put_batch of 1000", "rec/s", ">= 1.5x LMDB putmulti",
                         lambda value, ratio: ratio >= 1.5, note="baseline: LMDB putmulti"),
        "get": Row("get in batches of 1000", "rec/s", ">= 1.0x LMDB cursor",
                   lambda value, ratio: ratio >= 1.0, note="baseline: LMDB cursor"),
        "sync_threads": Row("sync put, 256 threads", "acked rec/s", ">= 100 k acked rec/s",
                            lambda value, ratio: value >= 1e5,
                            note="baseline: 4 KiB write + fdatasync per record"),
        "sync_asyncio": Row("sync put_async, 256 asyncio tasks", "acked rec/s",
                            ">= 100 k acked rec/s", lambda value, ratio: value >= 1e5,
                            note="baseline: 4 KiB write + fdatasync per record"),
        "durable_file": Row("durable put_batch of 1000 (sync flush)", "rec/s",
                            ">= 1.0x buffered file + fdatasync",
                            lambda value, ratio: ratio >= 1.0,
                            note="baseline: buffered file, flush() + fdatasync per batch"),
        "durable_lmdb": Row("durable put_batch of 1000 (sync flush)", "rec/s",
                            ">= 1.2x LMDB sync=True", lambda value, ratio: ratio >= 1.2,
                            note="baseline: LMDB sync=True, one transaction per batch"),
        **{f"latency_{tasks}": Row(
            f"sync-flush p99.9, {tasks} asyncio tasks", "ms", "< 5x lone fdatasync p99.9",
            lambda value, ratio: ratio < 5,
            note="baseline: p99.9 of one thread's 4 KiB append + fdatasync (a lower "
                 "ratio is better)", fmt=lambda value: f"{value:.2f} ms")
            for tasks in (16, 64)},
    }


def run(sizes: Sizes, work: Path) -> tuple[dict[str, Row], list[str]]:
    rows = _rows()
    extra: list[str] = []
    per_fsync: dict[str, list[float]] = {"sync_threads": [], "sync_asyncio": []}
    cold_starts: dict[int, list[float]] = {}
    ceilings: list[float] = []
    scans: list[tuple[float, float]] = []
    for _ in range(sizes.rounds):
        rows["put"].add(mqlog_put(work / "m", sizes), file_append(work / "b", sizes))
        rows["put_batch"].add(mqlog_put_batch(work / "m", sizes),
                              lmdb_putmulti(work / "b", sizes))
        rows["get"].add(mqlog_get(work / "m", sizes), lmdb_cursor(work / "b", sizes))
        for name, measure in (("sync_threads", mqlog_sync_threads),
                              ("sync_asyncio", mqlog_sync_asyncio)):
            rate, records_per_fsync = measure(work / "m", sizes)
            rows[name].add(rate, fdatasync_each(work / "b", sizes))
            per_fsync[name].append(records_per_fsync)
        ceilings.append(thread_handoff_ceiling(sizes))
        durable = durable_batches(work, sizes)
        if "file" in durable:
            rows["durable_file"].add(durable["mqlog"], durable["file"])
        if "lmdb" in durable:
            rows["durable_lmdb"].add(durable["mqlog"], durable["lmdb"])
        latencies, floor = tail_latency(work, sizes)
        for tasks, (latency, cold) in latencies.items():
            rows[f"latency_{tasks}"].add(latency * 1e3, floor * 1e3)
            cold_starts.setdefault(tasks, []).append(cold * 1e3)
        scans.append(mqlog_recovery(work / "m", sizes))
    extra.append(f"{rows['sync_threads'].name}: CPython's ceiling here, a ring of "
                 f"{sizes.producers} threads passing a lock (no store), made "
                 f"{statistics.median(ceilings) / 1e3:.0f} k hand-offs/s (median; a sync put "
                 "from a thread needs at least one)")
    for tasks, values in cold_starts.items():
        extra.append(f"sync-flush, {tasks} asyncio tasks: the first round of a new store "
                     f"(each task's first put, each making a consume queue; not in p99.9) "
                     f"took {statistics.median(values):.2f} ms (median; max "
                     f"{max(values):.2f})")
    for name, values in per_fsync.items():
        extra.append(f"{rows[name].name}: {statistics.median(values):.0f} records per fsync "
                     "(median over rounds)")
    scan, read = (statistics.median(values) for values in zip(*scans, strict=True))
    extra.append(f"recovery scan: {scan:.2f} GB/s of log (median; min "
                 f"{min(s for s, _ in scans):.2f}, max {max(s for s, _ in scans):.2f}); "
                 f"read() of the same files {read:.2f} GB/s; target >= 1 GB/s: "
                 f"{'yes' if scan >= 1 else '**no**'}")
    return rows, extra


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}, "
            f"mqlog core: {mqlog.IMPLEMENTATION}")


def render(rows: dict[str, Row], extra: list[str], sizes: Sizes) -> str:
    head = ["", "min", "median", "max", "baseline (median)", "ratio (median)", "target",
            "met"]
    lines = [f"Machine: {machine()}. {sizes.rounds} rounds, interleaved; 100-byte bodies.",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row.cells()) + " |" for row in rows.values() if row.values]
    lines.append("")
    lines += [f"* {row.name}: {row.note}" for row in rows.values() if row.values]
    lines += [f"* {text}" for text in extra]
    return "\n".join(lines)


PARTS = ("rows", *sweeps.SECTIONS)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "docs" / "bench"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mqlog bench compare",
                                     description="mqlog beside its baselines and peers")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds per measurement (default: 5 for the engine rows, "
                             "3 for the sweeps)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="directory for results.md and the PNG plots (default: %(default)s)")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated subset of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    args.only = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(set(args.only) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def report(args: argparse.Namespace, work: Path) -> str:
    """Run the chosen parts and return the Markdown report; plots go to ``args.out``."""
    sizes = dataclasses.replace(QUICK if args.quick else Sizes())
    if args.rounds:
        sizes.rounds = args.rounds
    sweep_sizes = sweeps.QUICK_SWEEPS if args.quick else sweeps.SweepSizes()
    started, load = time.monotonic(), os.getloadavg()
    body: list[str] = []
    if "rows" in args.only:
        rows, extra = run(sizes, work)
        body += ["## Engine rows and their targets", "", render(rows, extra, sizes), ""]
        sweeps.say(f"rows: done after {time.monotonic() - started:.0f} s")
    for name, section_of in sweeps.SECTIONS.items():
        if name not in args.only:
            continue
        section = section_of(sweep_sizes, args.rounds or sweep_sizes.rounds, work)
        body += [f"## {section.title}", "", *section.lines, ""]
        if section.plot is not None:
            body += plot(section, args.out / plot_name(args, name))
        sweeps.say(f"{name}: done after {time.monotonic() - started:.0f} s")
    head = [f"# mqlog comparison ({'quick' if args.quick else 'full'})", "",
            f"Machine: {machine()}. Rounds, interleaved: {sizes.rounds} for the engine "
            f"rows, {args.rounds or sweep_sizes.rounds} for the sweeps. "
            f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; took "
            f"{time.monotonic() - started:.0f} s; load average "
            f"{load[0]:.2f} before, {os.getloadavg()[0]:.2f} after.", ""]
    return "\n".join(head + body)


def plot(section: sweeps.Section, path: Path) -> list[str]:
    """Draw the section's plot into ``path``; the page's link to it."""
    assert section.plot is not None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        sweeps.say(f"{section.name}: no plot, matplotlib is not installed "
                   "(pip install '.[bench]')")
        return []
    path.parent.mkdir(parents=True, exist_ok=True)
    path = section.plot(path)
    return [f"![{section.title}]({path.name})", ""]


def results_name(args: argparse.Namespace) -> str:
    """``results.md`` for a full run of every part; a subset or a quick run gets a page
    of its own (``results-rows.md``, ``results-rows-peers-quick.md``)."""
    if set(args.only) == set(PARTS) and not args.quick:
        return "results.md"
    parts = [part for part in PARTS if part in args.only]
    return "results-" + "-".join(parts + (["quick"] if args.quick else [])) + ".md"


def plot_name(args: argparse.Namespace, sweep: str) -> str:
    """``<sweep>.png`` beside the full run's ``results.md``; a subset or a quick run's page
    gets plots of its own, named after it (``results-peers-quick-peers.png``), so they
    never overwrite the plots the full page shows."""
    page = results_name(args)
    return f"{sweep}.png" if page == "results.md" else f"{page.removesuffix('.md')}-{sweep}.png"


def main(argv: list[str] | None = None) -> int:
    """`mqlog bench compare`: print the report and write it to ``<out>/results.md`` (a
    subset or a quick run: see ``results_name``)."""
    args = parse(argv)
    work = Path(tempfile.mkdtemp(prefix="mqlog-compare-", dir=os.environ.get("MQLOG_BENCH_DIR")))
    try:
        text = report(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / results_name(args)).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
