"""What ISR replication costs a producer: acks=0, acks=1 and acks=all on partitions of
RF 3 (``min_insync_replicas = 2``) against one unreplicated partition, through
``ClusterClient``, in the same run (issue 17; Kafka's headline: 3x async replication
0.96, acks=all 0.51 of no replication — shared/ANCHORS.md).

Three controllers and three brokers as `mqlog node` processes (benchmarks/cluster.py's
cluster, ``[controller] min_insync_replicas = 2``), two topics of 6 partitions, leaders
spread over the brokers round-robin by the controller:

* ``replicated``: ``--layer isr``, RF 3; every write replicated to two followers, which
  fetch (long poll) from the leader.
* ``unreplicated``, the baseline: RF 1, one replica and no replication. It is a Raft
  topic of RF 1: ``min_insync_replicas`` is cluster-wide here (not per topic as in
  Kafka), and an ISR partition with fewer replicas than it is refused by its brokers
  (acks=all could never succeed); with acks=1 a single-replica Raft leader does what an
  ISR one would — store, answer — and never proposes.

Each round measures, for ``--seconds`` each, in an order rotated every round (the
baseline first, then last, ...): the baseline with acks=1, then acks=0, acks=1 and
acks=all on the replicated topic; each on ONE partition (one producer thread) and on all
6 partitions (one producer thread per partition, each its own ClusterClient). A producer
sends ``--batch`` 100-byte records per request (Kafka's producer batches too),
``--in-flight`` requests in flight (ClusterClient's max_in_flight_requests, 5 as
Kafka's; 1 measures the client of before, one at a time). Every loop ends with one
acks=all request on the same connection, inside the timed span: its answer comes once
everything sent before it is stored (or refused: counted) and on every ISR member — on
two shared cores, followers that fall behind an acks=0/1 producer would otherwise catch
up during the next figure, charging it with this one's replication. Reported: records/s,
and each as a ratio to the baseline of the same round and shape; medians over the
rounds; and the CPU time of all six processes per record (from /proc), which the load of
other work on the machine does not change as much. Absolute rates on two shared cores
are noise; the ratios are the figure.

Every store of every process runs with a page-cache window (``--page-cache-window``,
StoreConfig.page_cache_window_bytes; 64 MiB, the baseline's too): the log's synced pages
more than that far behind are dropped, and new pages reuse them. This VM hands freed
memory back to its host, and a page it never touched since costs 3-5 s of CPU per GB to
bring into the page cache (1 MiB per ms, 20-30 times a reused one: docs/BENCHMARKS.md,
fourteenth session); a replicated mode stores every byte three times, so without the
window the figures measure the VM's memory more than replication (0 shows that).

Followers' fetches wait at the leader for ``--fetch-min-bytes`` (``[controller]
replica_fetch_min_bytes``, Kafka's replica.fetch.min.bytes; 256 KiB here, 1 by default as
Kafka's) or ``replica_fetch_wait_max_ms``: acks=0/1's records reach followers in fewer,
larger answers; a fetch an acks=all write waits for is answered at once.

    python -m benchmarks.isr [--rounds 3] [--seconds 3] [--batch 100] [--in-flight 5]
                             [--page-cache-window BYTES] [--fetch-min-bytes BYTES]
                             [--store checkpoint_interval_ms=1000 ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from mqlog.cluster_client import ClusterClient, PendingProduce
from mqlog.replication.local import wait_until
from mqlog.replication.local_controller import (
    BROKERS,
    CONTROLLERS,
    ask,
    start,
    state,
    stop_all,
    write_configs,
)
from mqlog.results import PutStatus

PARTITIONS = 6
RECORD = bytes(range(100))
MODES = {"unreplicated": ("base", 1), "acks=0": ("orders", 0), "acks=1": ("orders", 1),
         "acks=all": ("orders", "all")}  # name -> (topic, acks)
SHAPES = (1, PARTITIONS)  # partitions written at once
ROLES = ("client", "leader", "follower", "controllers")
WINDOW_BYTES = 64 << 20  # every store's page-cache window (the docstring says why)
FETCH_MIN_BYTES = 256 << 10  # [controller] replica_fetch_min_bytes (the docstring says why)
LAST_CPU: dict[str, float] = {}  # measure()'s CPU seconds by process name, and records


def produce_for(brokers: list[str], topic: str, partition: int, acks: Any, seconds: float,
                batch: int, in_flight: int, counts: list[tuple[int, float, int]]) -> None:
    """One producer: batches to one partition for ``seconds``, up to ``in_flight``
    requests in flight; appends (records, elapsed seconds, acks=0 sends refused) to
    ``counts``."""
    bodies = [RECORD] * batch
    with ClusterClient(brokers, acks=acks, retry_timeout_s=60,
                       max_in_flight_requests=in_flight) as client:
        client.metadata()  # (what a long-lived producer has)
        count, started = 0, time.perf_counter()
        pending: deque[PendingProduce] = deque()
        while time.perf_counter() - started < seconds:
            pending.append(client.send_batch(topic, bodies, partition=partition))
            while pending and (pending[0].done() or len(pending) > in_flight):
                done = pending.popleft().result()
                assert done.status is PutStatus.PUT_OK, done
            count += batch
        # The span ends when everything sent is on every ISR member: one acks=all write
        # last (replication that would otherwise spill into the next figure is counted
        # in this one; an acks=0 loop's sends are all stored or refused by then).
        barrier = client.send_batch(topic, bodies, partition=partition, acks="all")
        for last in (*pending, barrier):
            assert last.result().status is PutStatus.PUT_OK, last.result()
        count += batch
        counts.append((count, time.perf_counter() - started, client.refused))


def cpu_seconds(processes: list[subprocess.Popen]) -> float:
    """User + system CPU time the processes used so far (Linux /proc; 0 elsewhere)."""
    total = 0
    for process in processes:
        try:
            fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU time this process (the producers: the client) used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def leader_of(controllers: list[str], topic: str, partition: int) -> str:
    """The broker the controller names leader of ``topic``'s ``partition`` ("" if none)."""
    found = state(ask(controllers, {"kind": "describe_cluster"}))
    return found.partition(topic, partition).leader if found is not None else ""


def by_role(cpu: dict[str, float], leader: str, records: int) -> dict[str, float]:
    """CPU microseconds per record of each role: the client, the partition's leader,
    each other broker (its followers; idle for the baseline), the three controllers."""
    others = [name for name in BROKERS if name != leader]
    per = 1e6 / max(records, 1)
    return {"client": cpu["client"] * per, "leader": cpu.get(leader, 0.0) * per,
            "follower": sum(cpu[name] for name in others) / len(others) * per,
            "controllers": sum(cpu[name] for name in CONTROLLERS) * per}


def own_core_rate(cpu: dict[str, float]) -> float:
    """Records/s if every process had a core of its own (a model, from the CPU each
    measured process spent: the busiest one's CPU per record bounds the rate; the
    client is one process, its producer threads share its GIL)."""
    busiest = max(seconds for name, seconds in cpu.items() if name != "records")
    return cpu["records"] / busiest if busiest > 0 else 0.0


def peer_messages(brokers: list[str]) -> tuple[int, int]:
    """Replication messages and their bytes the brokers sent each other so far
    (``broker_metadata``'s per-peer counters)."""
    messages = size = 0
    for address in brokers:
        answer = ask([address], {"kind": "broker_metadata"}) or {}
        for counters in answer.get("counters", {}).values():
            messages += counters.get("messages_sent", 0)
            size += counters.get("bytes_sent", 0)
    return messages, size


def measure(brokers: list[str], mode: str, shape: int, seconds: float, batch: int,
            processes: list[subprocess.Popen], in_flight: int = 1,
            names: dict[str, subprocess.Popen] | None = None,
            ) -> tuple[float, float, int, tuple[float, float]]:
    """Records/s of ``shape`` producers together (one per partition), the brokers' CPU
    seconds per million records, acks=0 refusals, and the peer messages per produce
    request with their mean size in bytes (fetches and their answers: how well fetch
    answers batch). ``names``: name -> process, whose CPU seconds (and the client's,
    "client") are left in ``LAST_CPU`` with the records ("records")."""
    topic, acks = MODES[mode]
    counts: list[tuple[int, float, int]] = []
    threads = [threading.Thread(target=produce_for, args=(
        brokers, topic, partition, acks, seconds, batch, in_flight, counts))
        for partition in range(shape)]
    messages, size = peer_messages(brokers)
    each = {name: cpu_seconds([process]) for name, process in (names or {}).items()}
    each["client"] = own_cpu_seconds()
    cpu = cpu_seconds(processes)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = cpu_seconds(processes) - cpu
    LAST_CPU.clear()
    LAST_CPU.update({name: cpu_seconds([process]) - each[name]
                     for name, process in (names or {}).items()})
    LAST_CPU["client"] = own_cpu_seconds() - each["client"]
    after = peer_messages(brokers)
    messages, size = after[0] - messages, after[1] - size
    if len(counts) != shape:
        raise RuntimeError(f"{shape - len(counts)} producer(s) of {mode} failed (see above)")
    records = sum(count for count, _, _ in counts)
    LAST_CPU["records"] = records
    return (records / max(elapsed for _, elapsed, _ in counts), cpu / records * 1e6,
            sum(refused for _, _, refused in counts),
            (messages / (records / batch), size / max(messages, 1)))


def prepare(controllers: list[str], brokers: list[str]) -> None:
    """Both topics created, and every partition taking writes."""
    wait_until(lambda: (found := state(ask(controllers, {"kind": "describe_cluster"})))
               is not None and len(found.live_brokers()) == 3, "three live brokers", 60)
    for topic, layer, factor in (("orders", "isr", 3), ("base", "raft", 1)):
        ask(controllers, {"kind": "create_topic", "name": topic, "partitions": PARTITIONS,
                          "replication_factor": factor, "layer": layer})
    with ClusterClient(brokers, retry_timeout_s=60) as client:
        for topic, acks in (("orders", "all"), ("base", 1)):
            for partition in range(PARTITIONS):
                sent = client.produce(topic, b"ready", partition=partition, acks=acks)
                assert sent.status is PutStatus.PUT_OK, sent


def idle_share(processes: list[subprocess.Popen], seconds: float = 2.0) -> float:
    """Cores the processes keep busy with no writes (ticks, heartbeats, long polls)."""
    before, started = cpu_seconds(processes), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds(processes) - before) / (time.perf_counter() - started)


def new_page_cost(directory: Path, size: int = 64 << 20) -> float:
    """CPU seconds per GB to put new pages in the page cache (zeros written with pwrite
    into a new file, 1 MiB a write): what every byte a broker stores costs before the
    record is copied in. On a virtual machine a page of memory the guest never touched
    costs several times one it touched and freed before (docs/BENCHMARKS.md); replicated
    modes store three times the baseline's bytes, so the figure says which machine ran."""
    path = directory / "new-page-probe"
    zeros = bytes(1 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        started = time.thread_time()
        for offset in range(0, size, len(zeros)):
            os.pwrite(fd, zeros, offset)
        spent = time.thread_time() - started
    finally:
        os.close(fd)
        path.unlink()
    return spent / (size / 1e9)


def run(rounds: int, seconds: float, batch: int, store: tuple[str, ...] = (),
        in_flight: int = 5, window: int = WINDOW_BYTES,
        fetch_min_bytes: int = FETCH_MIN_BYTES) -> dict[tuple[str, int], list[float]]:
    """{(mode, partitions): [records/s per round]}, {(mode, -partitions): [CPU seconds
    of every mqlog process per million records]}, {("MODE messages", partitions): [peer
    messages per request]}, {("MODE bytes", partitions): [their mean size]}, and the
    acks=0 sends refused under ("refused", 0), and new_page_cost at the start and the
    end under ("new pages", 0). ``store``: KEY=VALUE lines of every process's [store]
    table, after ``page_cache_window_bytes = window``; ``fetch_min_bytes``: the
    [controller] replica_fetch_min_bytes."""
    root = Path(tempfile.mkdtemp(prefix="mqlog-bench-isr-"))
    lines = ("[store]", f"page_cache_window_bytes = {window}", *store)
    extra = "".join(f"{line}\n" for line in lines)
    addresses = write_configs(root, 3_000, "min_insync_replicas = 2\n"
                              f"replica_fetch_min_bytes = {fetch_min_bytes}\n" + extra)
    controllers = [addresses[name] for name in CONTROLLERS]
    brokers = [addresses[name] for name in BROKERS]
    processes = {name: start(root, name) for name in CONTROLLERS + BROKERS}
    figures: dict[tuple[str, int], list[float]] = {("refused", 0): [0.0],
                                                   ("new pages", 0): [new_page_cost(root)]}
    try:
        prepare(controllers, brokers)
        figures[("idle", 0)] = [idle_share(list(processes.values()))]
        names = list(MODES)
        for index in range(rounds):
            turn = index % len(names)
            for mode in names[turn:] + names[:turn]:  # (rotated: no mode always first)
                for shape in SHAPES:
                    leader = leader_of(controllers, MODES[mode][0], 0)
                    rate, cpu, refused, (messages, size) = measure(
                        brokers, mode, shape, seconds, batch, list(processes.values()),
                        in_flight, processes)
                    if shape == 1:
                        roles = by_role(LAST_CPU, leader, int(LAST_CPU["records"]))
                        for role in ROLES:
                            figures.setdefault((f"{mode} {role}", 0), []).append(roles[role])
                    figures.setdefault((mode, shape), []).append(rate)
                    figures.setdefault((f"{mode} own core", shape), []).append(
                        own_core_rate(LAST_CPU))
                    figures.setdefault((mode, -shape), []).append(cpu)
                    figures.setdefault((f"{mode} messages", shape), []).append(messages)
                    figures.setdefault((f"{mode} bytes", shape), []).append(size)
                    figures[("refused", 0)][0] += refused
        figures[("new pages", 0)].append(new_page_cost(root))
    finally:
        stop_all(processes)
        shutil.rmtree(root, ignore_errors=True)  # (a run writes gigabytes)
    return figures


def report(figures: dict[tuple[str, int], list[float]], rounds: int, seconds: float,
           batch: int, in_flight: int = 1, window: int = WINDOW_BYTES,
           fetch_min_bytes: int = FETCH_MIN_BYTES) -> list[str]:
    lines = [f"ISR produce, 3 controllers + 3 brokers, {PARTITIONS} partitions, 100-byte "
             f"records in batches of {batch}, {in_flight} request(s) in flight per "
             f"producer, {rounds} rounds x {seconds} s per figure, page-cache window "
             f"{window >> 20} MiB per store" + (" (off: the kernel decides)" if not window
                                               else "") +
             f", replica_fetch_min_bytes {fetch_min_bytes:,}",
             "| mode | 1 partition rec/s | ratio | 6 partitions rec/s total | per partition "
             "| ratio |", "| --- | --- | --- | --- | --- | --- |"]
    for mode in MODES:
        cells = [mode]
        for shape in SHAPES:
            values = figures[(mode, shape)]
            ratios = [value / base for value, base in
                      zip(values, figures[("unreplicated", shape)], strict=True)]
            cells.append(f"{statistics.median(values):,.0f}")
            if shape > 1:
                cells.append(f"{statistics.median(values) / shape:,.0f}")
            cells.append(f"{statistics.median(ratios):.2f}x "
                         f"({', '.join(f'{ratio:.2f}' for ratio in ratios)})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "CPU seconds of all six processes per million records (lower is better; "
              "the ratio is the baseline's over the mode's: the throughput the same cores "
              "would give if the CPU were all theirs)",
              "| mode | 1 partition | ratio | 6 partitions | ratio |",
              "| --- | --- | --- | --- | --- |"]
    for mode in MODES:
        cells = [mode]
        for shape in SHAPES:
            values = figures[(mode, -shape)]
            ratios = [base / value if value else 0.0 for value, base in
                      zip(values, figures[("unreplicated", -shape)], strict=True)]
            cells += [f"{statistics.median(values):.1f}", f"{statistics.median(ratios):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Peer messages (fetches and their answers) per produce request, and their "
              "mean size (median of the rounds): fewer and larger is batching",
              "| mode | 1 partition | bytes | 6 partitions | bytes |",
              "| --- | --- | --- | --- | --- |"]
    for mode in list(MODES)[1:]:
        cells = [mode]
        for shape in SHAPES:
            cells += [f"{statistics.median(figures[(f'{mode} messages', shape)]):.2f}",
                      f"{statistics.median(figures[(f'{mode} bytes', shape)]):,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if ("unreplicated client", 0) in figures:
        lines += role_lines(figures)
    if ("unreplicated own core", 1) in figures:
        lines += own_core_lines(figures)
    lines.append(f"acks=0 sends refused (lost): {figures[('refused', 0)][0]:.0f}; load average "
                 f"at the end {os.getloadavg()[0]:.1f}")
    if len(figures.get(("new pages", 0), ())) == 2:
        start, end = figures[("new pages", 0)]
        lines.append(f"new page cache: {start:.2f} s of CPU per GB at the start, {end:.2f} "
                     "at the end (a VM's memory never touched before costs several times "
                     "memory touched and freed: docs/BENCHMARKS.md)")
    return lines


def role_lines(figures: dict[tuple[str, int], list[float]]) -> list[str]:
    """The fourth table: CPU per record by role, 1 partition (what bounds each ratio)."""
    idle = figures.get(("idle", 0), [0.0])[0]
    lines = ["", "CPU microseconds per record by role, 1 partition (median of the rounds): "
             "the client (this process's producer), the partition's leader, each other "
             f"broker (its followers), the three controllers; with no writes the six "
             f"processes keep {idle:.2f} of a core busy",
             "| mode | client | leader | each follower | controllers | sum |",
             "| --- | --- | --- | --- | --- | --- |"]
    for mode in MODES:
        values = [statistics.median(figures[(f"{mode} {role}", 0)]) for role in ROLES]
        total = values[0] + values[1] + 2 * values[2] + values[3]
        lines.append("| " + " | ".join([mode, *(f"{value:.2f}" for value in values),
                                        f"{total:.2f}"]) + " |")
    return lines


def own_core_lines(figures: dict[tuple[str, int], list[float]]) -> list[str]:
    """The fifth table: the rates if each process had a core of its own (own_core_rate),
    what a cluster of one machine per broker would be bound by, as Kafka's headline ran;
    here every process shares two cores, so a follower's CPU is the producer's loss."""
    lines = ["", "If each process had a core of its own (a model: records/s = 1 / the "
             "busiest process's CPU seconds per record, medians of the rounds; the "
             "measured rates above share two cores among all six)",
             "| mode | 1 partition rec/s | ratio | 6 partitions rec/s | ratio |",
             "| --- | --- | --- | --- | --- |"]
    for mode in MODES:
        cells = [mode]
        for shape in SHAPES:
            values = figures[(f"{mode} own core", shape)]
            ratios = [value / base if base else 0.0 for value, base in
                      zip(values, figures[("unreplicated own core", shape)], strict=True)]
            cells += [f"{statistics.median(values):,.0f}",
                      f"{statistics.median(ratios):.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=100, help="records per request")
    parser.add_argument("--in-flight", type=int, default=5,
                        help="requests in flight per producer (ClusterClient's "
                        "max_in_flight_requests; 1: one at a time)")
    parser.add_argument("--page-cache-window", type=int, default=WINDOW_BYTES,
                        metavar="BYTES", help="every store's page_cache_window_bytes "
                        "(0: the kernel decides, the store's default)")
    parser.add_argument("--fetch-min-bytes", type=int, default=FETCH_MIN_BYTES,
                        metavar="BYTES", help="[controller] replica_fetch_min_bytes (1: "
                        "Kafka's default, every fetch answered at once)")
    parser.add_argument("--store", action="append", default=[], metavar="KEY=VALUE",
                        help="a line of every process's [store] table (TOML), repeatable")
    args = parser.parse_args(argv)
    figures = run(args.rounds, args.seconds, args.batch, tuple(args.store), args.in_flight,
                  args.page_cache_window, args.fetch_min_bytes)
    print("\n".join(report(figures, args.rounds, args.seconds, args.batch, args.in_flight,
                           args.page_cache_window, args.fetch_min_bytes)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
