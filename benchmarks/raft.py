"""Committed writes through a Raft group of 3 and 5 node processes, against the same
client and a single node without replication, beside a PySyncObj cluster.

Clusters are real `mqlog node` processes on 127.0.0.1 (mqlog.replication.local), stores
with sync flush (a write is on disk before it counts), followers acking only flushed
bytes. The baseline is one node alone (no replication layer waiting), same store
settings. One asyncio client drives the leader over one connection in three modes:

* sequential: one produce of one record in flight;
* pipelined: 4,096 produces of one record in flight;
* batched: 64 produces of 100 records each in flight.

Each produce carries a producer id and sequence (idempotent, as GroupClient sends).
Reported per mode and cluster: committed requests/s, records/s, p50 / p99 latency, and
the ratio to the single node in the same round; each round runs every cluster in turn
(interleaved, so this shared machine's load hits all alike), then PySyncObj
(benchmarks/pysyncobj_peer.py: 3 nodes, no fsync, both appendEntriesUseBatch settings,
best taken; random 100-byte records for both, as PySyncObj compresses what it sends).
Targets (issue 7): pipelined single records at least 3x PySyncObj's best,
batched records/s at least PySyncObj's best with the same batch, and batched at least
0.3x the single node.

    python -m benchmarks.raft [--rounds 1] [--seconds 3] [--sizes 3,5] [--no-pysyncobj]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mqlog.client import produce_request
from mqlog.replication.local import LocalCluster, LocalRaftCluster
from mqlog.replication.node import split_address
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame

RECORD = bytes(random.Random(7).randrange(256) for _ in range(100))  # PySyncObj compresses
STORE = 'segment_size_bytes = 67108864\nflush_mode = "sync"'
# (requests in flight, records per request). PySyncObj's pipelined run keeps 10,000 in
# flight and its batched run 1,000 batches (benchmarks/pysyncobj_peer.py).
MODES = {"sequential": (1, 1), "pipelined": (4096, 1), "batched": (64, 100)}


@dataclass
class Run:
    requests_per_s: float
    records_per_s: float
    p50_ms: float
    p99_ms: float


@dataclass
class Series:
    runs: list[Run] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        return statistics.median(getattr(run, name) for run in self.runs)


async def drive(address: str, seconds: float, window: int, batch: int) -> Run:
    """Keep ``window`` produce requests in flight for ``seconds``; count the PUT_OKs."""
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    bodies = [RECORD] * batch
    decoder, sent, started_at = FrameDecoder(1 << 20), {}, time.perf_counter()
    latencies: list[float] = []
    deadline, next_id, producer = started_at + seconds, 0, f"bench-{time.monotonic_ns()}"
    try:
        while True:
            now, frames = time.perf_counter(), []
            while len(sent) < window and now < deadline:
                next_id += 1
                header, payload = produce_request("bench", bodies, producer=(producer, next_id))
                header["id"] = next_id
                frames.append(encode_frame(header, payload))
                sent[next_id] = now
            writer.write(b"".join(frames))  # one system call for all
            if not sent:
                break
            await writer.drain()
            decoder.feed(await reader.read(1 << 20) or _closed())
            while isinstance(frame := decoder.next_frame(), Frame):
                _check(frame)
                latencies.append(time.perf_counter() - sent.pop(frame.header["id"]))
    finally:
        writer.close()
    elapsed = time.perf_counter() - started_at
    latencies.sort()
    return Run(len(latencies) / elapsed, len(latencies) * batch / elapsed,
               latencies[len(latencies) // 2] * 1000, latencies[len(latencies) * 99 // 100] * 1000)


def _closed() -> bytes:
    raise ConnectionError("the node closed the connection")


def _check(frame: Frame) -> None:
    if frame.header.get("status") != "PUT_OK":
        raise RuntimeError(f"the leader answered {frame.header}")


def measure_cluster(root: Path, size: int, seconds: float) -> dict[str, Run]:
    """Every mode against a fresh cluster of ``size`` voters (0: one node, no replication)."""
    if size == 0:
        cluster: Any = LocalCluster(root, "ASYNC_MASTER", slave_count=0, store_settings=STORE)
    else:
        cluster = LocalRaftCluster(root, size, store_settings=STORE)
    with cluster:
        address = cluster.address(cluster.master if size == 0 else cluster.wait_leader())
        # Warm up: fresh nodes map and warm their next segment in the background first.
        asyncio.run(drive(address, min(2.0, seconds), *MODES["pipelined"]))
        return {mode: asyncio.run(drive(address, seconds, window, batch))
                for mode, (window, batch) in MODES.items()}


def run(rounds: int, seconds: float, sizes: list[int]) -> dict[tuple[str, int], Series]:
    results: dict[tuple[str, int], Series] = {}
    with tempfile.TemporaryDirectory(prefix="mqlog-bench-raft-") as work:
        for round_index in range(rounds):
            per_size = {size: measure_cluster(Path(work) / f"r{round_index}-{size}", size,
                                              seconds) for size in [0, *sizes]}
            for size, runs in per_size.items():
                for mode, measured in runs.items():
                    series = results.setdefault((mode, size), Series())
                    series.runs.append(measured)
                    series.ratios.append(measured.records_per_s /
                                         per_size[0][mode].records_per_s)
    return results


def pysyncobj_best(seconds: float) -> dict[str, dict]:
    """PySyncObj's best run per mode (3 nodes), over both appendEntriesUseBatch settings."""
    from benchmarks import pysyncobj_peer

    best: dict[str, dict] = {}
    for measured in pysyncobj_peer.run_all(nodes=3, duration_s=seconds, record_size=len(RECORD),
                                           batch=MODES["batched"][1], payload="random"):
        mode = measured["mode"]
        if mode not in best or measured["records_per_s"] > best[mode]["records_per_s"]:
            best[mode] = measured
    return best


def table(results: dict[tuple[str, int], Series], peer: dict[str, dict]) -> str:
    lines = ["| mode | cluster | requests/s | records/s | p50 ms | p99 ms | x single node "
             "| x PySyncObj best |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (mode, size), series in sorted(results.items(), key=lambda item: (
            list(MODES).index(item[0][0]), item[0][1])):
        name = "single node" if size == 0 else f"raft {size} nodes"
        versus = peer.get(mode)
        lines.append(
            f"| {mode} | {name} | {series.median('requests_per_s'):,.0f} | "
            f"{series.median('records_per_s'):,.0f} | {series.median('p50_ms'):.2f} | "
            f"{series.median('p99_ms'):.2f} | {statistics.median(series.ratios):.2f}x | "
            + (f"{series.median('records_per_s') / versus['records_per_s']:.2f}x |"
               if versus and size else "- |"))
    for mode, measured in peer.items():
        lines.append(f"| {mode} | PySyncObj 3 nodes (no fsync, batch="
                     f"{measured['append_entries_use_batch']}) | {measured['ops_per_s']:,.0f} | "
                     f"{measured['records_per_s']:,.0f} | {measured['p50_ms']:.2f} | "
                     f"{measured['p99_ms']:.2f} | - | 1.00x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", default="3,5", help="comma-separated group sizes")
    parser.add_argument("--no-pysyncobj", action="store_true")
    args = parser.parse_args(argv)
    results = run(args.rounds, args.seconds, [int(size) for size in args.sizes.split(",")])
    peer = {} if args.no_pysyncobj else pysyncobj_best(args.seconds)
    print(table(results, peer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
