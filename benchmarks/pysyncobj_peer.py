"""PySyncObj as the Raft peer: a real cluster replicating mqlog-like records, measured.

mqlog's Raft layer will replicate batches of opaque records (100-byte bodies by default)
from a leader to its followers and acknowledge a write once a majority holds it. The
nearest thing a Python user would pick instead is PySyncObj (pure-Python Raft), so this
module runs a real PySyncObj cluster on this machine and reports what it commits.

Theory of operation:

* The cluster: ``nodes`` (3 or 5) OS processes, started with multiprocessing's "spawn"
  context, each one PySyncObj node (``RecordLog``, a ``SyncObj`` subclass) listening on
  127.0.0.1 on an ephemeral port picked free by the parent. The parent only steers: each
  node serves a control pipe (status, run a workload, stop). It polls every node until
  all name the same leader and that leader has a quorum (with a deadline).
* The replicated state: ``RecordLog.append(records)``, a ``@replicated`` method that takes
  a list of bytes records (one record for single-record operations) and adds them to a
  record count and a byte total. The records themselves live in PySyncObj's Raft log,
  its default in-memory journal (``journalFile=None``): nothing reaches a disk. PySyncObj
  never fsyncs on its write path anyway (a journal file is an mmap, msync'd only when
  closed), so its acknowledgements never wait for a disk. The state keeps counters, not the
  records, because PySyncObj compacts its log every 5000 entries by pickling and
  gzipping the whole state in the tick thread: a state holding every record would make
  each compaction cost O(all records so far) and the benchmark would measure gzip.
* The client: PySyncObj has no client protocol; the caller is a cluster member and a
  call made on a follower is forwarded to the leader. So the workload runs inside the
  leader's process (its main thread, beside PySyncObj's tick thread), as an application
  built on PySyncObj would: the leader is where a write costs least.
* An operation is one ``append`` call with a completion callback; it counts once its
  callback reports ``FAIL_REASON.SUCCESS``, i.e. a majority has the entry and the leader
  applied it (commit latency as the caller sees it). A window bounds the operations in
  flight. Each run has a warm-up (at least ``warmup_s``, and until a whole window of
  operations has completed, so the queue is in its steady state), then a measured
  interval of ``duration_s``: only successful callbacks inside it count (throughput and
  latency samples). Then submitting stops and the operations still in flight are drained
  (with a deadline). PySyncObj's logged errors are counted per run (``node_errors``).
* Records (``payload``) are random bytes by default: PySyncObj zlib-compresses every
  message, so ``filler`` records (one letter repeated, as mqlog's own benchmarks write
  and as mqlog, which does not compress, is indifferent to) flatter it several-fold in
  the batched mode. Both come from a pool of distinct objects (pickle would write a
  repeated object once per batch).

Modes, each with ``appendEntriesUseBatch`` True (PySyncObj's default: the leader sends new
entries only every ``appendEntriesPeriod``, 0.1 s) and False (each new entry is sent at
once, one message per entry and follower), so the better configuration can be taken:

* sequential — one record per operation, one operation at a time (window 1);
* pipelined — one record per operation, up to ``window`` (10,000) in flight;
* batched — ``batch`` (100) records per operation, up to ``batch_window`` (1,000) in flight.

The windows are deep on purpose. With ``appendEntriesUseBatch`` a round trip takes at least
one 0.1 s period, so a window of 1,000 operations caps PySyncObj at about 10,000 ops/s
(it does about 8,000 so); 10,000 lets it reach what its CPU allows (about 2.5x more here;
deeper adds latency, not throughput). The batched window stops at 1,000 (10 MB of random
records in flight): deeper gains little with random records, and at 6,000 the cluster
stalled here (its window not drained in 30 s; PySyncObj's connection buffers are bytes
appended to and re-sliced, quadratic in what is queued). The cost is latency: by Little's
law p50 is about window / throughput, so the latencies of the pipelined and batched modes
describe a saturated queue; the sequential mode gives the unloaded commit latency.

Everything (the nodes, the client) shares this machine's 2 cores, so the absolute figures
are for comparison with mqlog measured the same way, not for their own sake.

    python -m benchmarks.pysyncobj_peer --nodes 3 --duration 3
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from itertools import cycle
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated

HOST = "127.0.0.1"
LEADER_DEADLINE_S = 30.0  # start to an agreed leader with a quorum
REPLY_DEADLINE_S = 10.0  # a control request answered (status, stop)
COMMIT_DEADLINE_S = 10.0  # no window slot freed for this long: the cluster is stuck
DRAIN_DEADLINE_S = 30.0  # after the run, the operations in flight all answered
WARMUP_DEADLINE_S = 60.0  # past warmup_s, for the first window to complete
STOP_DEADLINE_S = 5.0  # each of stop / terminate / kill, per process
POOL_BYTES = 1 << 20  # distinct records to cycle through: more than a message's worth
WINDOW = 10_000  # pipelined: operations in flight (see the docstring)
BATCH_WINDOW = 1_000  # batched: operations in flight, 100,000 records at batch=100
WARMUP_S = 1.0
PAYLOADS = ("random", "filler")


class RecordLog(SyncObj):  # type: ignore[misc]
    """The replicated state: how many records and bytes were appended (see the docstring)."""

    records: int = 0
    total_bytes: int = 0

    @replicated  # type: ignore[misc]
    def append(self, records: list[bytes]) -> int:
        self.records += len(records)
        self.total_bytes += sum(map(len, records))
        return self.records


# --- inside a node process -------------------------------------------------------------


@dataclass
class Tally:
    """Completed operations, counted by the callbacks (PySyncObj's tick thread).

    The warm-up lasts until ``warmup_until`` and until ``turnover`` operations (one full
    window) have completed, so the measured interval starts in the steady state; it then
    lasts ``duration_s``.
    """

    warmup_until: float
    turnover: int
    duration_s: float
    slots: threading.Semaphore
    start: float = math.inf
    end: float = math.inf
    warmed: int = 0
    ok: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)

    def done(self, sent: float, _result: Any, error: int) -> None:
        now = time.perf_counter()
        self.slots.release()
        if self.start == math.inf:
            self.warmed += 1
            if self.warmed >= self.turnover and now >= self.warmup_until:
                self.start, self.end = now, now + self.duration_s
            return
        if now >= self.end:
            return
        if error != FAIL_REASON.SUCCESS:
            self.failed += 1
            return
        self.ok += 1
        self.latencies.append(now - sent)


def record_batches(record_size: int, batch: int, payload: str) -> list[list[bytes]]:
    """Batches of distinct records, together at least POOL_BYTES: random bytes, or
    ``filler`` (one letter repeated, like ``b"r" * 100`` in mqlog's own benchmarks)."""
    count = max(POOL_BYTES // max(record_size, 1), 4 * batch)
    count -= count % batch
    if payload == "random":
        blob = os.urandom(count * record_size)
        pool = [blob[i * record_size:(i + 1) * record_size] for i in range(count)]
    elif payload == "filler":
        pool = [bytes([97 + i % 26]) * record_size for i in range(count)]
    else:
        raise ValueError(f"payload must be one of {PAYLOADS}, got {payload!r}")
    return [pool[i:i + batch] for i in range(0, count, batch)]


def percentile(ordered: list[float], fraction: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def drive(node: RecordLog, duration_s: float, warmup_s: float, window: int,
          record_size: int, batch: int, payload: str) -> dict[str, Any]:
    """Keep up to ``window`` appends of ``batch`` records in flight; count the committed."""
    slots = threading.Semaphore(window)
    began = time.perf_counter()
    tally = Tally(began + warmup_s, window, duration_s, slots)
    for records in cycle(record_batches(record_size, batch, payload)):
        if not slots.acquire(timeout=COMMIT_DEADLINE_S):
            raise RuntimeError(f"no commit for {COMMIT_DEADLINE_S} s")
        sent = time.perf_counter()
        if sent >= tally.end:
            slots.release()
            break
        if tally.start == math.inf and sent > began + warmup_s + WARMUP_DEADLINE_S:
            raise RuntimeError(f"the window did not turn over in {WARMUP_DEADLINE_S} s")
        node.append(records, callback=partial(tally.done, sent))
    drain(slots, window)
    latencies = sorted(tally.latencies)
    return {"ops": tally.ok, "records": tally.ok * batch, "failed": tally.failed,
            "warmup_s": tally.start - began, "elapsed_s": duration_s,
            "ops_per_s": tally.ok / duration_s,
            "records_per_s": tally.ok * batch / duration_s,
            "p50_ms": percentile(latencies, 0.50) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def drain(slots: threading.Semaphore, window: int) -> None:
    deadline = time.monotonic() + DRAIN_DEADLINE_S
    for _ in range(window):
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise RuntimeError(f"operations still in flight after {DRAIN_DEADLINE_S} s")


class ErrorLog(logging.Handler):
    """Counts PySyncObj's logged errors (say, a failed tick) and prints each on one line."""

    def __init__(self, address: str) -> None:
        super().__init__(logging.ERROR)
        self.address = address
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        error = record.exc_info[1] if record.exc_info else None
        print(f"pysyncobj node {self.address}: {record.getMessage()}: {error!r}",
              file=sys.stderr)


def node_status(node: RecordLog, errors: ErrorLog) -> dict[str, Any]:
    status = {"self": node.selfNode.id, "leader": None, "is_leader": False,
              "has_quorum": False, "errors": errors.count, "log_len": node._getRaftLogSize()}
    with contextlib.suppress(RuntimeError):  # the tick thread changes the sets read here
        leader = node._getLeader()
        status.update(leader=None if leader is None else leader.id,
                      is_leader=node._isLeader(), has_quorum=node.hasQuorum)
    return status


def serve(node: RecordLog, errors: ErrorLog, conn: Connection) -> None:
    """Answer the parent's requests until it says stop (or goes away)."""
    handlers: dict[str, Callable[..., Any]] = {
        "status": lambda: node_status(node, errors),
        "run": lambda spec: drive(node, **spec),
    }
    while True:
        try:
            request, *args = conn.recv()
        except EOFError:
            return
        if request == "stop":
            return
        try:
            reply = ("ok", handlers[request](*args))
        except Exception:
            reply = ("error", traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:  # the parent went away
            return


def node_main(address: str, others: list[str], use_batch: bool, conn: Connection) -> None:
    """A node process: one RecordLog with the default in-memory journal."""
    node = None
    errors = ErrorLog(address)
    logger = logging.getLogger("pysyncobj")
    logger.addHandler(errors)
    logger.propagate = False
    try:
        conf = SyncObjConf(appendEntriesUseBatch=use_batch)
        node = RecordLog(address, others, conf)
        serve(node, errors, conn)
    except KeyboardInterrupt:
        pass
    finally:
        if node is not None:
            node.destroy_synchronous()


# --- the parent --------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Distinct ports free on 127.0.0.1 (all held open until all are chosen)."""
    with contextlib.ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind((HOST, 0))
        return [probe.getsockname()[1] for probe in probes]


class Cluster:
    """``nodes`` PySyncObj processes on 127.0.0.1, started and stopped as a context manager."""

    def __init__(self, nodes: int = 3, append_entries_use_batch: bool = True) -> None:
        self.nodes = nodes
        self.use_batch = append_entries_use_batch
        self.addresses = [f"{HOST}:{port}" for port in free_ports(nodes)]
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.leader = -1

    def __enter__(self) -> Cluster:
        try:
            self.start()
            self.leader = self.wait_leader()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        context = multiprocessing.get_context("spawn")
        for address in self.addresses:
            ours, theirs = context.Pipe()
            others = [other for other in self.addresses if other != address]
            process = context.Process(target=node_main, daemon=True,
                                      args=(address, others, self.use_batch, theirs))
            self.conns.append(ours)
            process.start()
            self.processes.append(process)
            theirs.close()

    def ask(self, index: int, request: tuple[Any, ...], timeout: float) -> Any:
        conn = self.conns[index]
        conn.send(request)
        if not conn.poll(timeout):
            raise TimeoutError(f"node {self.addresses[index]}: no answer to {request[0]}")
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"node {self.addresses[index]}: {value}")
        return value

    def wait_leader(self, deadline_s: float = LEADER_DEADLINE_S) -> int:
        """Index of the node every node names as leader and which has a quorum."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            statuses = self.statuses()
            named = {status["leader"] for status in statuses}
            if len(named) == 1 and None not in named:
                index = self.addresses.index(named.pop())
                if statuses[index]["is_leader"] and statuses[index]["has_quorum"]:
                    return index
            time.sleep(0.05)  # poll interval, not synchronisation
        raise TimeoutError(f"no agreed leader among {self.nodes} nodes in {deadline_s} s")

    def run(self, mode: str, duration_s: float, warmup_s: float, window: int,
            record_size: int, batch: int, payload: str) -> dict[str, Any]:
        """Run one workload on the leader (see ``drive``); its figures, labelled."""
        spec = {"duration_s": duration_s, "warmup_s": warmup_s, "window": window,
                "record_size": record_size, "batch": batch, "payload": payload}
        timeout = (warmup_s + WARMUP_DEADLINE_S + duration_s + COMMIT_DEADLINE_S
                   + DRAIN_DEADLINE_S + REPLY_DEADLINE_S)
        self.leader = self.wait_leader()  # the leader of the previous run may have lost it
        errors_before = sum(status["errors"] for status in self.statuses())
        figures = self.ask(self.leader, ("run", spec), timeout)
        after = self.statuses()
        return {"mode": mode, "nodes": self.nodes, "append_entries_use_batch": self.use_batch,
                "record_size": record_size, "batch": batch, "window": window,
                "payload": payload, **figures,
                "node_errors": sum(status["errors"] for status in after) - errors_before,
                "empty_log_nodes": sum(status["log_len"] == 0 for status in after)}

    def statuses(self) -> list[dict[str, Any]]:
        return [self.ask(i, ("status",), REPLY_DEADLINE_S) for i in range(self.nodes)]

    def stop(self) -> None:
        """Ask every node to stop; terminate, then kill, whatever is left after a deadline."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        for ending in (None, BaseProcess.terminate, BaseProcess.kill):
            for process in self.processes:
                if ending is not None and process.is_alive():
                    ending(process)
                process.join(STOP_DEADLINE_S if ending is None else STOP_DEADLINE_S / 2)
        for conn in self.conns:
            conn.close()
        self.conns = []


# --- the modes -----------------------------------------------------------------------------


def sequential(cluster: Cluster, duration_s: float = 3.0, record_size: int = 100,
               warmup_s: float = WARMUP_S, payload: str = "random") -> dict[str, Any]:
    """One record per operation, each waiting for its commit before the next."""
    return cluster.run("sequential", duration_s, warmup_s, 1, record_size, 1, payload)


def pipelined(cluster: Cluster, duration_s: float = 3.0, record_size: int = 100,
              window: int = WINDOW, warmup_s: float = WARMUP_S,
              payload: str = "random") -> dict[str, Any]:
    """One record per operation, up to ``window`` operations in flight."""
    return cluster.run("pipelined", duration_s, warmup_s, window, record_size, 1, payload)


def batched(cluster: Cluster, duration_s: float = 3.0, record_size: int = 100,
            batch: int = 100, window: int = BATCH_WINDOW, warmup_s: float = WARMUP_S,
            payload: str = "random") -> dict[str, Any]:
    """``batch`` records per operation, up to ``window`` operations in flight."""
    return cluster.run("batched", duration_s, warmup_s, window, record_size, batch, payload)


def run_all(nodes: int = 3, duration_s: float = 3.0, record_size: int = 100, batch: int = 100,
            window: int = WINDOW, batch_window: int = BATCH_WINDOW,
            warmup_s: float = WARMUP_S, payload: str = "random") -> list[dict[str, Any]]:
    """Every mode with appendEntriesUseBatch True then False: one fresh cluster for each."""
    results = []
    for use_batch in (True, False):
        with Cluster(nodes, use_batch) as cluster:
            results.append(sequential(cluster, duration_s, record_size, warmup_s, payload))
            results.append(pipelined(cluster, duration_s, record_size, window, warmup_s,
                                     payload))
            results.append(batched(cluster, duration_s, record_size, batch, batch_window,
                                   warmup_s, payload))
    return results


def best(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode, the result with the most records/s (the better appendEntriesUseBatch)."""
    chosen: dict[str, dict[str, Any]] = {}
    for result in results:
        held = chosen.get(result["mode"])
        if held is None or result["records_per_s"] > held["records_per_s"]:
            chosen[result["mode"]] = result
    return chosen


def table(results: list[dict[str, Any]]) -> Iterator[str]:
    yield ("| mode | nodes | useBatch | rec/op | window | payload | ops/s | records/s "
           "| p50 ms | p99 ms | ops | failed | node errors |")
    yield "| --- " * 13 + "|"
    for r in results:
        yield (f"| {r['mode']} | {r['nodes']} | {r['append_entries_use_batch']} | {r['batch']} "
               f"| {r['window']:,} | {r['payload']} | {r['ops_per_s']:,.0f} "
               f"| {r['records_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
               f"| {r['ops']:,} | {r['failed']} | {r['node_errors']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=WARMUP_S)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", type=int, default=WINDOW, help="pipelined ops in flight")
    parser.add_argument("--batch-window", type=int, default=BATCH_WINDOW,
                        help="batched ops in flight")
    parser.add_argument("--payload", choices=PAYLOADS, default="random")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # run finally:
    started = time.perf_counter()
    try:
        results = run_all(args.nodes, args.duration, args.record_size, args.batch,
                          args.window, args.batch_window, args.warmup, args.payload)
    except KeyboardInterrupt:  # the clusters are stopped by then
        print("interrupted", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - started
    print("\n".join(table(results)))
    print("\nbest per mode:", ", ".join(
        f"{mode}: useBatch={r['append_entries_use_batch']} {r['records_per_s']:,.0f} rec/s"
        for mode, r in best(results).items()))
    broken = [r for r in results if r["node_errors"] or r["empty_log_nodes"]]
    for r in broken:
        print(f"warning: {r['mode']} useBatch={r['append_entries_use_batch']}: "
              f"{r['node_errors']} PySyncObj errors, {r['empty_log_nodes']} node(s) left "
              "with an empty Raft log (see stderr)")
    print(f"run_all: {elapsed:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
