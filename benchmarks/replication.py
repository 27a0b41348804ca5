"""Produce through mqlog.Client to a master with two slaves, against the same master alone.

Three local clusters of real node processes on 127.0.0.1 (mqlog.replication.local):
a master alone (the baseline), an ASYNC_MASTER with 2 slaves, a SYNC_MASTER with 2
slaves that needs 1 of them per write. Each round starts each cluster afresh, in turn
(interleaved, so load on this shared machine hits all three alike), and drives it with
``clients`` threads, each with its own connection, producing 100-byte records one
request at a time. Reported per configuration: records/s and p50 / p99 request latency,
min / median / max over rounds, and the median of the per-round ratios to the baseline.
Targets (the issue's; Kafka's headline ratios are 0.96 async and 0.51 sync): async at
least 0.8x, sync at least 0.5x.

Everything — three node processes, the client threads — shares this machine's cores,
so the absolute figures say little; the ratios are the result.

    python -m benchmarks.replication [--rounds 3] [--seconds 3] [--clients 32]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mqlog.client import Client
from mqlog.replication.local import LocalCluster
from mqlog.results import PutStatus

BODY = b"r" * 100
CONFIGS = {  # name -> (role, slaves)
    "master alone": ("ASYNC_MASTER", 0),
    "ASYNC_MASTER + 2 slaves": ("ASYNC_MASTER", 2),
    "SYNC_MASTER + 2 slaves (1 acks)": ("SYNC_MASTER", 2),
}
TARGETS = {"ASYNC_MASTER + 2 slaves": 0.8, "SYNC_MASTER + 2 slaves (1 acks)": 0.5}


@dataclass
class Measured:
    rates: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)


def measure(root: Path, role: str, slaves: int, clients: int, seconds: float) -> tuple:
    """(records/s, p50 ms, p99 ms) of ``clients`` threads producing for ``seconds``."""
    cluster = LocalCluster(root, role, slave_count=slaves)
    with cluster:
        latencies: list[list[float]] = [[] for _ in range(clients)]
        failures: list[str] = []
        stop = threading.Event()

        def produce(index: int) -> None:
            with Client(cluster.address("m")) as client:
                while not stop.is_set():
                    started = time.perf_counter()
                    status = client.produce("bench", BODY, queue_id=index % 8).status
                    if status is not PutStatus.PUT_OK:
                        failures.append(status.value)
                        return
                    latencies[index].append(time.perf_counter() - started)

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        stop.wait(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{role} with {slaves} slaves answered {failures[0]}")
    samples = sorted(value for per_client in latencies for value in per_client)
    return (len(samples) / elapsed, samples[len(samples) // 2] * 1000,
            samples[len(samples) * 99 // 100] * 1000)


def run(rounds: int, seconds: float, clients: int) -> dict[str, Measured]:
    results = {name: Measured() for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="mqlog-bench-repl-") as work:
        for round_index in range(rounds):
            for index, (name, (role, slaves)) in enumerate(CONFIGS.items()):
                rate, p50, p99 = measure(Path(work) / f"r{round_index}-{index}", role, slaves,
                                         clients, seconds)
                results[name].rates.append(rate)
                results[name].p50_ms.append(p50)
                results[name].p99_ms.append(p99)
    return results


def table(results: dict[str, Measured]) -> str:
    baseline = results["master alone"].rates
    lines = ["| configuration | rec/s min | median | max | p50 ms | p99 ms | ratio (median) "
             "| target | met |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, measured in results.items():
        ratio = statistics.median(v / b for v, b in zip(measured.rates, baseline, strict=True))
        target = TARGETS.get(name)
        met = "-" if target is None else ("yes" if ratio >= target else "**no**")
        lines.append(f"| {name} | {min(measured.rates):,.0f} | "
                     f"{statistics.median(measured.rates):,.0f} | {max(measured.rates):,.0f} | "
                     f"{statistics.median(measured.p50_ms):.2f} | "
                     f"{statistics.median(measured.p99_ms):.2f} | {ratio:.2f}x | "
                     f"{'' if target is None else f'>= {target}x'} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    print(table(run(args.rounds, args.seconds, args.clients)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
