"""The comparison sweeps: mqlog beside its peers and its floor, each figure a ratio.

This machine is shared and noisy, so no figure stands alone. Every section runs in
rounds; inside a round it measures mqlog, its peers and the baseline one after the other,
and a figure's ratio is taken round by round against the baseline from the same round.
Tables give median, min and max over rounds, the baseline's median, and the median (and
range) of the per-round ratios.

Sections (``SECTIONS``):

* peers — write rec/s (fast and durable) and sequential read rec/s, 100-byte bodies in
  batches of 1000, for mqlog and the stores of ``benchmarks/peers.py``. Baseline: the
  buffered file (length-prefixed records appended to one file), the floor.
* sizes — mqlog ``put_batch`` against the buffered file and LMDB for bodies of 16 B to
  64 KiB, the same payload volume at each size: rec/s and MB/s of payload. Baseline:
  the buffered file. Shows where the per-record cost (72-byte header, CRC, index entry)
  gives way to the copy.
* queues — N queues written at once (1 to 10,000), records spread round-robin, one call
  per record. mqlog keeps one commit log whatever N (RocketMQ's layout); the baseline
  keeps one buffered file per queue (Kafka's partition layout) and so N open files. Two
  figures: writes alone (page cache), and writes plus one final sync of everything
  (``store.flush()``, against ``fdatasync`` of every file), where many files cost most.
* latency — ack latency percentiles of ``put_async`` with ``flush_mode="sync"`` against
  the number of concurrent asyncio tasks. Baseline: one thread appending 4 KiB and
  calling ``fdatasync`` per record, the cost of one durable write alone. Here a ratio
  below 1 is better.

Each sweep also draws a PNG (matplotlib, Agg backend) into the output directory.
"""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mqlog
from benchmarks import peers

BODY = b"m" * 100


@dataclass(frozen=True)
class SweepSizes:
    rounds: int = 3  # `--rounds` overrides it
    peer_records: int = 500_000
    size_bytes_per_point: int = 64 << 20  # payload per (body size, store) measurement
    size_records_max: int = 1_000_000
    size_records_min: int = 64
    body_sizes: tuple[int, ...] = (16, 100, 1024, 4096, 16384, 65536)
    queue_records: int = 100_000
    queue_counts: tuple[int, ...] = (1, 10, 100, 1000, 10_000)
    queue_seconds_max: float = 10.0  # a side that slow is timed on the records written so far
    concurrencies: tuple[int, ...] = (1, 16, 64, 256)
    latency_acks: int = 4000  # acknowledged puts per concurrency level and round
    fsync_samples: int = 2000
    segment_size_bytes: int = 256 << 20


QUICK_SWEEPS = SweepSizes(rounds=2, peer_records=3000, size_bytes_per_point=256 << 10,
                          size_records_max=4000, size_records_min=8,
                          queue_records=2000, queue_counts=(1, 10, 100),
                          concurrencies=(1, 4, 16), latency_acks=64, fsync_samples=32,
                          segment_size_bytes=16 << 20)


# --- figures over rounds -----------------------------------------------------------------

@dataclass
class Figure:
    """One quantity over rounds, beside its baseline measured in the same rounds."""

    values: list[float] = field(default_factory=list)
    baselines: list[float] = field(default_factory=list)

    def add(self, value: float, baseline: float) -> None:
        self.values.append(value)
        self.baselines.append(baseline)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def ratios(self) -> list[float]:
        return [v / b for v, b in zip(self.values, self.baselines, strict=True) if b]

    def cells(self, fmt: Callable[[float], str]) -> list[str]:
        ratios = self.ratios or [0.0]
        return [fmt(self.median), fmt(min(self.values)), fmt(max(self.values)),
                fmt(statistics.median(self.baselines)), f"{statistics.median(ratios):.2f}x",
                f"{min(ratios):.2f}–{max(ratios):.2f}"]


FIGURE_HEAD = ["median", "min", "max", "baseline (median)", "ratio (median)",
               "ratio (min–max)"]


@dataclass
class Section:
    """What one sweep produced: Markdown lines, and a plot drawn from its figures into
    the PNG file it is given (the harness names the file: a quick or partial run's plots
    are its own, see compare.plot_name)."""

    name: str
    title: str
    lines: list[str]
    plot: Callable[[Path], Path] | None = None


def rate(value: float) -> str:
    if value >= 1e5:
        return f"{value / 1e6:.2f} M"
    return f"{value / 1e3:.1f} k" if value >= 100 else f"{value:.0f}"


def millis(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def say(text: str) -> None:
    """Progress and skip lines go to stderr; the tables go to stdout."""
    print(text, file=sys.stderr, flush=True)


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def rotated(items: Sequence, by: int) -> list:
    """The round's order: each round starts one item later, so no peer always goes first."""
    by %= max(1, len(items))
    return list(items[by:]) + list(items[:by])


# --- peers --------------------------------------------------------------------------------

def open_peer(cls: type[peers.Peer], root: Path, durable: bool,
              sizes: SweepSizes) -> peers.Peer:
    if cls is peers.MqlogPeer:
        return peers.MqlogPeer.open(root, durable, sizes.segment_size_bytes)
    return cls.open(root, durable)


def write_batches(peer: peers.Peer, count: int, body: bytes) -> tuple[int, float]:
    """Write about ``count`` records in batches of 1000 (fewer if 4 MiB is reached first).

    Returns (records written, records/s).
    """
    per_batch = max(1, min(1000, (4 << 20) // len(body), count))
    bodies = [body] * per_batch
    batches = max(1, count // per_batch)

    def run() -> None:
        for _ in range(batches):
            peer.put_batch(bodies)
        peer.end_writes()
    return batches * per_batch, batches * per_batch / timed(run)


def measure_peer(cls: type[peers.Peer], root: Path, sizes: SweepSizes) -> dict[str, float]:
    """Write fast, read back, then write durable: records/s for each."""
    figures: dict[str, float] = {}
    peer = open_peer(cls, root, False, sizes)
    try:
        written, figures["write, fast"] = write_batches(peer, sizes.peer_records, BODY)
        started = time.perf_counter()
        seen = peer.read_all()
        figures["sequential read"] = seen / (time.perf_counter() - started)
        if seen != written:
            raise RuntimeError(f"wrote {written} records but read back {seen}")
    finally:
        peer.close()
    peer = open_peer(cls, root, True, sizes)
    try:
        figures["write, durable"] = write_batches(peer, sizes.peer_records, BODY)[1]
    finally:
        peer.close()
    shutil.rmtree(root, ignore_errors=True)
    return figures


PEER_FIGURES = ("write, fast", "write, durable", "sequential read")


def peers_section(sizes: SweepSizes, rounds: int, work: Path) -> Section:
    notes: list[str] = []
    live: list[type[peers.Peer]] = []
    for cls in peers.PEERS:
        reason = cls.missing()
        if reason:
            say(f"peers: skipping {cls.name}: {reason}")
            notes.append(f"{cls.name}: skipped ({reason})")
        else:
            live.append(cls)
    raw: dict[str, list[dict[str, float]]] = {cls.name: [] for cls in live}
    for round_index in range(rounds):
        for cls in rotated(live, round_index):
            if cls.name not in raw:
                continue
            try:
                raw[cls.name].append(measure_peer(cls, work / "peer", sizes))
            except Exception as error:  # a peer that breaks is dropped, not fatal
                say(f"peers: dropping {cls.name}: {type(error).__name__}: {error}")
                notes.append(f"{cls.name}: dropped after an error ({error})")
                del raw[cls.name]
    return render_peers(raw, [cls for cls in live if cls.name in raw], notes, sizes)


def render_peers(raw: dict[str, list[dict[str, float]]], live: list[type[peers.Peer]],
                 notes: list[str], sizes: SweepSizes) -> Section:
    baseline = raw[peers.FilePeer.name]
    figures: dict[tuple[str, str], Figure] = {}
    rows = []
    for cls in live:
        for what in PEER_FIGURES:
            figure = Figure()
            for mine, floor in zip(raw[cls.name], baseline, strict=True):
                figure.add(mine[what], floor[what])
            figures[cls.name, what] = figure
            rows.append([cls.name, what, *figure.cells(rate)])
    lines = [f"{sizes.peer_records:,} records of 100 bytes in batches of 1000; records/s. "
             "Baseline: the buffered file in the same round.", ""]
    lines += table(["store", "figure", *FIGURE_HEAD], rows)
    lines.append("")
    lines += [f"* {cls.name}, durable: {cls.durable_means}" for cls in live]
    lines.append(f"* {peers.SqlitePeer.name}, fast: {peers.SqlitePeer.fast_means}")
    lines += [f"* {note}" for note in notes]
    return Section("peers", "Peers: write and read, 100-byte records", lines,
                   lambda path: plot_peers(figures, path))


# --- message size -------------------------------------------------------------------------

def size_label(size: int) -> str:
    return f"{size >> 10} KiB" if size >= 1024 else f"{size} B"


def sizes_section(sizes: SweepSizes, rounds: int, work: Path) -> Section:
    stores: list[type[peers.Peer]] = [peers.MqlogPeer, peers.FilePeer]
    notes: list[str] = []
    if (reason := peers.LmdbPeer.missing()) is None:
        stores.append(peers.LmdbPeer)
    else:
        say(f"sizes: skipping {peers.LmdbPeer.name}: {reason}")
        notes.append(f"{peers.LmdbPeer.name}: skipped ({reason})")
    counts = {size: max(sizes.size_records_min,
                        min(sizes.size_records_max, sizes.size_bytes_per_point // size))
              for size in sizes.body_sizes}
    raw: dict[tuple[int, str], list[float]] = {}
    for round_index in range(rounds):
        for size in sizes.body_sizes:
            body = bytes(size)
            for cls in rotated(stores, round_index):
                peer = open_peer(cls, work / "size", False, sizes)
                try:
                    raw.setdefault((size, cls.name), []).append(
                        write_batches(peer, counts[size], body)[1])
                finally:
                    peer.close()
                shutil.rmtree(work / "size", ignore_errors=True)
    return render_sizes(raw, stores, counts, notes)


def render_sizes(raw: dict[tuple[int, str], list[float]], stores: list[type[peers.Peer]],
                 counts: dict[int, int], notes: list[str]) -> Section:
    figures: dict[tuple[int, str], Figure] = {}
    rows = []
    for size, count in counts.items():
        for cls in stores:
            figure = Figure()
            for mine, floor in zip(raw[size, cls.name], raw[size, peers.FilePeer.name],
                                   strict=True):
                figure.add(mine, floor)
            figures[size, cls.name] = figure
            megabytes = figure.median * size / 1e6
            rows.append([size_label(size), f"{count:,}", cls.name, *figure.cells(rate),
                         f"{megabytes:,.0f}"])
    lines = ["Write rec/s, fast mode, batches of 1000 records (or of 4 MiB, if less); "
             "about the same payload volume at every size. MB/s counts payload bytes only "
             "(mqlog adds a 72-byte header per record, the file 4 bytes). Baseline: the "
             "buffered file in the same round.", ""]
    lines += table(["body", "records", "store", *FIGURE_HEAD, "MB/s (median)"], rows)
    lines += [""] + [f"* {note}" for note in notes]
    return Section("sizes", "Throughput against message size", lines,
                   lambda path: plot_sizes(figures, stores, list(counts), path))


# --- queue count --------------------------------------------------------------------------

def raise_fd_limit(needed: int) -> bool:
    """Raise the soft RLIMIT_NOFILE to fit ``needed`` fds; True if they fit.

    The soft limit goes up to the hard one; past it only a privileged process (root, or
    CAP_SYS_RESOURCE) may go, so that is tried too and its refusal taken quietly.
    """
    infinity = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == infinity or soft >= needed:
        return True
    if hard == infinity or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == infinity else hard, hard))
        return True
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, needed))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return False
    return True


def fds_in_use() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64


def fit_queue_count(count: int) -> tuple[int, str]:
    """The number of queues this process can hold open, near ``count``, and a note.

    mqlog holds two descriptors per consume-queue file (its own, and the one mmap
    duplicates); the baseline one per file. If 2N do not fit under the hard limit but
    N do, the sweep runs at the largest N that fits (down to 90% of it) and says so.
    """
    spare = fds_in_use() + 64
    if raise_fd_limit(2 * count + spare):
        return count, ""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fitted = (soft - spare) // 2 // 100 * 100
    if fitted >= count * 0.9:
        return fitted, (f"N={count:,} measured as N={fitted:,}: mqlog would need "
                        f"{2 * count + spare:,} descriptors and RLIMIT_NOFILE is {soft:,}")
    return 0, (f"N={count:,} skipped: mqlog would need {2 * count + spare:,} descriptors "
               f"and RLIMIT_NOFILE is {soft:,}")


def mqlog_queues(root: Path, count: int, sizes: SweepSizes) -> tuple[float, float]:
    """Records/s of single puts spread over ``count`` queues: written; written and synced."""
    store = mqlog.open(peers.fresh(root), segment_size_bytes=sizes.segment_size_bytes)
    try:
        put, records = store.put, sizes.queue_records
        for queue_id in range(count):  # untimed: every queue exists before the clock starts
            put("bench", BODY, queue_id)

        started, written = time.perf_counter(), 0
        deadline = started + sizes.queue_seconds_max
        while written < records and time.perf_counter() < deadline:  # checked per thousand
            for i in range(written, min(records, written + 1000)):
                put("bench", BODY, i % count)
            written = min(records, written + 1000)
        write = time.perf_counter() - started
        sync = timed(store.flush)
    finally:
        store.close()
    return written / write, written / (write + sync)


def file_queues(root: Path, count: int, sizes: SweepSizes) -> tuple[float, float]:
    """The same into one buffered file per queue: ``count`` files open at once."""
    peers.fresh(root)
    files = [open(root / f"{queue_id:05d}.log", "wb") for queue_id in range(count)]  # noqa: SIM115
    try:
        pack, records = peers.HEADER.pack, sizes.queue_records
        for file in files:
            file.write(pack(len(BODY)))
            file.write(BODY)
            file.flush()

        def sync() -> None:
            for file in files:
                os.fdatasync(file.fileno())
        started, written = time.perf_counter(), 0
        deadline = started + sizes.queue_seconds_max
        while written < records and time.perf_counter() < deadline:  # as mqlog_queues
            for i in range(written, min(records, written + 1000)):
                file = files[i % count]
                file.write(pack(len(BODY)))
                file.write(BODY)
            written = min(records, written + 1000)
        for file in files:
            file.flush()
        write = time.perf_counter() - started
        synced = timed(sync)
    finally:
        for file in files:
            file.close()
    return written / write, written / (write + synced)


QUEUE_FIGURES = ("write", "write + sync")


def queues_section(sizes: SweepSizes, rounds: int, work: Path) -> Section:
    counts, notes = [], []
    for count in sizes.queue_counts:
        fitted, note = fit_queue_count(count)
        if note:
            say(f"queues: {note}")
            notes.append(note)
        if fitted:
            counts.append(fitted)
    raw: dict[tuple[int, str, str], list[float]] = {}
    for round_index in range(rounds):
        for count in counts:
            sides = [("mqlog", mqlog_queues), ("one file per queue", file_queues)]
            for name, measure in rotated(sides, round_index):
                for what, value in zip(QUEUE_FIGURES, measure(work / "queues", count, sizes),
                                       strict=True):
                    raw.setdefault((count, name, what), []).append(value)
                shutil.rmtree(work / "queues", ignore_errors=True)
    figures: dict[tuple[int, str, str], Figure] = {}
    rows = []
    for count in counts:
        for name in ("mqlog", "one file per queue"):
            for what in QUEUE_FIGURES:
                figure = figures[count, name, what] = Figure()
                for mine, floor in zip(raw[count, name, what],
                                       raw[count, "one file per queue", what], strict=True):
                    figure.add(mine, floor)
                rows.append([f"{count:,}", name, what, *figure.cells(rate)])
    lines = [f"{sizes.queue_records:,} records of 100 bytes, one call per record, spread "
             "round-robin over N queues (one record per queue written first, untimed; a side "
             f"still writing after {sizes.queue_seconds_max:.0f} s stops at the next "
             "thousand and is timed on what it wrote); "
             "records/s. 'write + sync' adds one final sync of everything: mqlog "
             "`store.flush()`, the files `fdatasync` each. Baseline: one buffered file per "
             "queue in the same round.", ""]
    lines += table(["N queues", "store", "figure", *FIGURE_HEAD], rows)
    lines += [""] + [f"* {note}" for note in notes]
    return Section("queues", "Throughput against the number of queues", lines,
                   lambda path: plot_queues(figures, counts, path))


# --- sync-flush latency -------------------------------------------------------------------

async def ack_latencies(store: mqlog.Store, tasks: int,
                        per_task: int) -> tuple[list[float], float]:
    """Each task's ack latencies of ``per_task`` put_async calls, and the cold start: how
    long the first round took (every task's first put, awaited together before any timed
    one). That round makes each task's consume queue (a directory and a mapped file
    each, ~0.1-0.4 ms here) on the event loop, so with 16 new queues the whole round
    waits ~3-5 ms: a fresh store's one-off cost, reported on its own, not mixed into the
    steady state's tail (it was all of p99.9's 16 worst samples of 4,096)."""
    latencies: list[float] = []
    put, clock = store.put_async, time.perf_counter

    async def produce(worker: int) -> None:
        for _ in range(per_task):
            started = clock()
            await put("bench", BODY, queue_id=worker % 16)
            latencies.append(clock() - started)
    started = clock()
    await asyncio.gather(*(put("bench", BODY, queue_id=worker % 16)
                           for worker in range(tasks)))
    cold = clock() - started
    await asyncio.gather(*(produce(worker) for worker in range(tasks)))
    return latencies, cold


def mqlog_latency(root: Path, tasks: int,
                  sizes: SweepSizes) -> tuple[list[float], float, float]:
    """Sorted ack latencies (s) of put_async under sync flush after the first round,
    acked records/s, and the first round's latency (s): see ack_latencies."""
    per_task = max(4, sizes.latency_acks // tasks)
    with mqlog.open(peers.fresh(root), segment_size_bytes=sizes.segment_size_bytes,
                    flush_mode="sync") as store:
        started = time.perf_counter()
        latencies, cold = asyncio.run(ack_latencies(store, tasks, per_task))
        elapsed = time.perf_counter() - started - cold
    return sorted(latencies), len(latencies) / elapsed, cold


def fdatasync_latency(root: Path, samples: int) -> tuple[list[float], float]:
    """Sorted latencies of one 4 KiB append + fdatasync from one thread, and ops/s."""
    fd = os.open(peers.fresh(root) / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    block, clock, latencies = bytes(4096), time.perf_counter, []
    try:
        started = clock()
        for _ in range(samples):
            begun = clock()
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(clock() - begun)
        elapsed = clock() - started
    finally:
        os.close(fd)
    return sorted(latencies), samples / elapsed


PERCENTILES = (("p50", 0.50), ("p99", 0.99), ("p99.9", 0.999))


def latency_section(sizes: SweepSizes, rounds: int, work: Path) -> Section:
    figures: dict[tuple[int, str], Figure] = {}
    for _ in range(rounds):
        floor, floor_rate = fdatasync_latency(work / "fsync", sizes.fsync_samples)
        for tasks in sizes.concurrencies:
            latencies, acked, cold = mqlog_latency(work / "latency", tasks, sizes)
            figures.setdefault((tasks, "acked rec/s"), Figure()).add(acked, floor_rate)
            for name, fraction in PERCENTILES:
                figures.setdefault((tasks, name), Figure()).add(
                    percentile(latencies, fraction), percentile(floor, fraction))
            figures.setdefault((tasks, "first round"), Figure()).add(cold, floor[-1])
        shutil.rmtree(work / "fsync", ignore_errors=True)
        shutil.rmtree(work / "latency", ignore_errors=True)
    rows = [[str(tasks), what, *figure.cells(rate if what == "acked rec/s" else millis)]
            for (tasks, what), figure in figures.items()]
    lines = ["asyncio tasks each awaiting `put_async` of 100 bytes in turn, "
             f"`flush_mode=\"sync\"`; about {sizes.latency_acks:,} acks per level and round. "
             "Baseline: one thread appending 4 KiB + `fdatasync` per record "
             f"({sizes.fsync_samples:,} samples per round), the same percentile "
             "(for acked rec/s: its ops/s). For latency a ratio below 1 is better. "
             "The percentiles are of the acks after the first round; \"first round\" is "
             "that round on a new store, every task's first put at once (each makes a "
             "consume queue), against the slowest lone fdatasync.", ""]
    lines += table(["tasks", "figure", *FIGURE_HEAD], rows)
    return Section("latency", "Sync-flush ack latency against concurrency", lines,
                   lambda path: plot_latency(figures, list(sizes.concurrencies), path))


# --- plots -------------------------------------------------------------------------------

def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def errorbar(axes: Any, xs: Sequence[float], figures: Sequence[Figure], scale: float = 1.0,
             **style: Any) -> None:
    """Median with a bar from the round minimum to the round maximum."""
    medians = [f.median * scale for f in figures]
    lows = [m - min(f.values) * scale for m, f in zip(medians, figures, strict=True)]
    highs = [max(f.values) * scale - m for m, f in zip(medians, figures, strict=True)]
    axes.errorbar(xs, medians, yerr=[lows, highs], capsize=3, marker="o", markersize=4,
                  **style)


def ticks(axes: Any, xs: Sequence[int], label: Callable[[int], str] = str) -> None:
    """Ticks at the measured points only, labelled in the table's words."""
    axes.set_xticks(list(xs), [label(x) for x in xs])
    axes.minorticks_off()


def save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    pyplot().close(figure)
    return path


def plot_peers(figures: dict[tuple[str, str], Figure], path: Path) -> Path:
    plt = pyplot()
    names = list(dict.fromkeys(name for name, _ in figures))
    figure, axes = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(PEER_FIGURES)
    for index, what in enumerate(PEER_FIGURES):
        xs = [i + (index - 1) * width for i in range(len(names))]
        medians = [figures[name, what].median / 1e6 for name in names]
        axes.bar(xs, medians, width, label=what)
    axes.set_xticks(range(len(names)), names)
    axes.set_ylabel("M records/s (median)")
    axes.set_title("100-byte records, batches of 1000")
    axes.legend(fontsize="small")
    return save(figure, path)


def plot_sizes(figures: dict[tuple[int, str], Figure], stores: list[type[peers.Peer]],
               body_sizes: list[int], path: Path) -> Path:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for cls in stores:
        series = [figures[size, cls.name] for size in body_sizes]
        errorbar(left, body_sizes, series, 1e-6, label=cls.name)
        payload = [Figure([value * size for value in item.values])
                   for size, item in zip(body_sizes, series, strict=True)]
        errorbar(right, body_sizes, payload, 1e-6, label=cls.name)
    for axes, label in ((left, "M records/s"), (right, "MB/s of payload")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        ticks(axes, body_sizes, size_label)
        axes.set_xlabel("body size")
        axes.set_ylabel(label)
        axes.grid(True, which="major", alpha=0.3)
    left.legend(fontsize="small")
    figure.suptitle("Write throughput against message size (fast mode)")
    return save(figure, path)


def plot_queues(figures: dict[tuple[int, str, str], Figure], counts: list[int],
                path: Path) -> Path:
    plt = pyplot()
    figure, panels = plt.subplots(1, 2, figsize=(9, 3.6))
    for axes, what in zip(panels, QUEUE_FIGURES, strict=True):
        for name in ("mqlog", "one file per queue"):
            errorbar(axes, counts, [figures[c, name, what] for c in counts], 1e-6, label=name)
        axes.set_xscale("log")
        axes.set_yscale("log")
        ticks(axes, counts, lambda count: f"{count:,}")
        axes.set_xlabel("queues written at once")
        axes.set_ylabel("M records/s")
        axes.set_title(what)
        axes.grid(True, which="major", alpha=0.3)
    panels[0].legend(fontsize="small")
    return save(figure, path)


def plot_latency(figures: dict[tuple[int, str], Figure], concurrencies: list[int],
                 path: Path) -> Path:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6))
    for (name, _), color in zip(PERCENTILES, ("C0", "C1", "C2"), strict=True):
        series = [figures[tasks, name] for tasks in concurrencies]
        errorbar(left, concurrencies, series, 1e3, label=f"mqlog {name}", color=color)
        floor = statistics.median(series[0].baselines) * 1e3
        left.axhline(floor, color=color, linestyle="--", linewidth=1,
                     label=f"4 KiB + fdatasync {name}")
    errorbar(right, concurrencies, [figures[t, "acked rec/s"] for t in concurrencies], 1e-3,
             label="mqlog put_async, sync flush")
    right.axhline(statistics.median(figures[concurrencies[0], "acked rec/s"].baselines) / 1e3,
                  color="grey", linestyle="--", label="4 KiB + fdatasync, one thread")
    for axes, label in ((left, "ack latency (ms)"), (right, "k acked records/s")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        ticks(axes, concurrencies)
        axes.set_xlabel("concurrent asyncio tasks")
        axes.set_ylabel(label)
        axes.grid(True, which="major", alpha=0.3)
        axes.legend(fontsize="x-small")
    return save(figure, path)


SECTIONS: dict[str, Callable[[SweepSizes, int, Path], Section]] = {
    "peers": peers_section,
    "sizes": sizes_section,
    "queues": queues_section,
    "latency": latency_section,
}
