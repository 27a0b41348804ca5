"""Produce throughput of several Raft groups over three brokers against one group on the
same brokers, in the same run (issue 16: do partitions add throughput, and where does it
stop on this machine's cores?).

Three `mqlog node` broker processes on 127.0.0.1 (mqlog.replication.local_brokers) host
``--groups`` Raft groups each (every broker a voter of every group), stores with sync
flush, followers acking flushed bytes. Leaderships are spread round-robin over the
brokers by leadership transfers, as Kafka spreads partition leaders. Then, for
``--seconds`` each, interleaved per round:

* one group: ``--groups`` connections, all to the first group's leader;
* every group: one connection to each group's leader;

each connection keeping ``--window`` produce requests of ``--batch`` 100-byte records in
flight (the same client concurrency both times). Reported: committed records/s of each,
and their ratio (every group / one group) per round and its median.

    python -m benchmarks.brokers [--rounds 3] [--seconds 3] [--groups 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from mqlog.client import Client, produce_request
from mqlog.replication.local import wait_until
from mqlog.replication.local_brokers import LocalBrokers
from mqlog.replication.node import split_address
from mqlog.replication.wire import Frame, FrameDecoder, encode_frame

RECORD = bytes(range(100))
STORE = 'segment_size_bytes = 67108864\nflush_mode = "sync"'


async def drive(address: str, group: str, deadline: float, window: int, batch: int) -> int:
    """Keep ``window`` produce requests in flight to ``group`` until ``deadline``; the
    number of records acknowledged PUT_OK."""
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    decoder, in_flight, next_id, acked = FrameDecoder(1 << 20), 0, 0, 0
    producer = f"bench-{group}-{time.monotonic_ns()}"
    try:
        while True:
            frames = []
            while in_flight < window and time.perf_counter() < deadline:
                next_id += 1
                header, payload = produce_request(f"{group}-topic", [RECORD] * batch,
                                                  producer=(producer, next_id))
                header["id"], header["group"] = next_id, group
                frames.append(encode_frame(header, payload))
                in_flight += 1
            writer.write(b"".join(frames))
            if not in_flight:
                return acked
            await writer.drain()
            data = await reader.read(1 << 20)
            if not data:
                raise ConnectionError(f"{address} closed the connection")
            decoder.feed(data)
            while isinstance(frame := decoder.next_frame(), Frame):
                in_flight -= 1
                if frame.header.get("status") != "PUT_OK":
                    raise RuntimeError(f"{group}'s leader answered {frame.header}")
                acked += batch
    finally:
        writer.close()


async def measure(targets: list[tuple[str, str]], seconds: float, window: int,
                  batch: int) -> float:
    """Records/s committed by one connection per (address, group) target, together."""
    started = time.perf_counter()
    counts = await asyncio.gather(*(drive(address, group, started + seconds, window, batch)
                                    for address, group in targets))
    return sum(counts) / (time.perf_counter() - started)


def spread_leaders(brokers: LocalBrokers) -> dict[str, str]:
    """Move group i's leadership to broker i mod 3 (Kafka's round-robin of leaders)."""
    wanted = {group: brokers.names[index % len(brokers.names)]
              for index, group in enumerate(brokers.groups)}
    for group, target in wanted.items():
        def moved(group: str = group, target: str = target) -> bool:
            leader = brokers.wait_leaders().get(group)
            if leader == target:
                return True
            assert leader is not None
            try:
                with Client(brokers.address(leader), group=group) as client:
                    client.transfer(target)
            except Exception:  # noqa: BLE001 (an election meanwhile: ask again)
                pass
            return False
        wait_until(moved, f"{group}'s leadership to move to {target}")
    return wanted


def run(rounds: int, seconds: float, group_count: int, window: int, batch: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mqlog-bench-brokers-") as work, \
            LocalBrokers(Path(work), group_count=group_count, store_settings=STORE) as brokers:
        leaders = spread_leaders(brokers)
        one = [(brokers.address(leaders["g1"]), "g1")] * group_count
        every = [(brokers.address(leaders[group]), group) for group in brokers.groups]
        asyncio.run(measure(every, min(seconds, 2.0), window, batch))  # warm up
        ratios = []
        print(f"| round | 1 group records/s | {group_count} groups records/s | ratio |")
        print("| --- | --- | --- | --- |")
        for index in range(rounds):
            single = asyncio.run(measure(one, seconds, window, batch))
            spread = asyncio.run(measure(every, seconds, window, batch))
            ratios.append(spread / single)
            print(f"| {index + 1} | {single:,.0f} | {spread:,.0f} | {spread / single:.2f}x |",
                  flush=True)
        print(f"median ratio {group_count} groups / 1 group: {statistics.median(ratios):.2f}x "
              f"(leaders {leaders})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--groups", type=int, default=6)
    parser.add_argument("--window", type=int, default=8, help="requests in flight per connection")
    parser.add_argument("--batch", type=int, default=100, help="records per request")
    args = parser.parse_args(argv)
    run(args.rounds, args.seconds, args.groups, args.window, args.batch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
