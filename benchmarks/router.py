"""What the cluster router costs: keyed single-record produce through ``ClusterClient``
against hand routing on the same cluster, in the same run (issue 16).

Three controllers and three brokers as `mqlog node` processes (benchmarks/cluster.py's
cluster), a topic of 6 partitions x RF 3 as Raft groups, every leader known and reported
first. Each round measures, back to back, ``--seconds`` of one thread producing records
keyed ``key-<i>``:

* ``hand``: the baseline — ``partition_for_key`` by the caller, one ``GroupClient`` per
  partition whose first address is the partition's leader (what the process test did
  before the router);
* ``router``: ``ClusterClient.produce(topic, body, key=key)`` (metadata cached, one
  connection per broker, the leader from the reported leaders).

The ratio router / hand is the figure; on two busy cores, absolute rates are noise.

    python -m benchmarks.router [--rounds 3] [--seconds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.cluster import started
from mqlog.cluster_client import ClusterClient
from mqlog.group_client import GroupClient
from mqlog.partitioner import partition_for_key
from mqlog.replication.local import wait_until
from mqlog.replication.local_controller import BROKERS, CONTROLLERS, ask
from mqlog.results import PutStatus

PARTITIONS = 6


def _hand(brokers: list[str], leaders: dict[int, str], seconds: float) -> int:
    clients = {p: GroupClient([leaders[p], *(a for a in brokers if a != leaders[p])],
                              group=f"orders-{p}") for p in range(PARTITIONS)}
    count, stop = 0, time.perf_counter() + seconds
    try:
        while time.perf_counter() < stop:
            key = f"key-{count}"
            partition = partition_for_key(key, PARTITIONS)
            result = clients[partition].produce("orders", key.encode(), partition, key)
            assert result.status is PutStatus.PUT_OK
            count += 1
    finally:
        for client in clients.values():
            client.close()
    return count


def _router(brokers: list[str], seconds: float) -> int:
    count = 0
    with ClusterClient(brokers) as client:
        client.metadata()  # (what a long-lived producer has)
        stop = time.perf_counter() + seconds
        while time.perf_counter() < stop:
            key = f"key-{count}"
            assert client.produce("orders", key.encode(), key=key).status is PutStatus.PUT_OK
            count += 1
    return count


def run(rounds: int, seconds: float) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"hand": [], "router": []}
    with started("mqlog-bench-router-", 3_000) as (_root, addresses, _processes):
        controllers = [addresses[name] for name in CONTROLLERS]
        brokers = [addresses[name] for name in BROKERS]
        ask(controllers, {"kind": "create_topic", "name": "orders", "partitions": PARTITIONS,
                          "replication_factor": 3, "layer": "raft"})
        with ClusterClient(brokers, retry_timeout_s=60) as client:
            client.partitions_for("orders")  # (waits for the brokers to pull it)
            wait_until(lambda: all(
                client.metadata(refresh=True).partition("orders", p).leader_epoch > 0
                for p in range(PARTITIONS)), "every leader reported", 60)
            view = client.metadata()
        leaders = {p: view.brokers[view.partition("orders", p).leader].address
                   for p in range(PARTITIONS)}
        for _ in range(rounds):
            figures["hand"].append(_hand(brokers, leaders, seconds) / seconds)
            figures["router"].append(_router(brokers, seconds) / seconds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    figures = run(args.rounds, args.seconds)
    print(f"keyed single-record produce, 3 controllers + 3 brokers, {PARTITIONS} partitions x "
          f"RF 3 (Raft), {args.rounds} rounds x {args.seconds} s")
    for name, values in figures.items():
        print(f"  {name:7s} median {statistics.median(values):8.0f} records/s "
              f"({', '.join(f'{value:.0f}' for value in values)})")
    ratios = [router / hand for router, hand in zip(figures["router"], figures["hand"],
                                                    strict=True)]
    print(f"  router / hand: median {statistics.median(ratios):.2f}x "
          f"({', '.join(f'{ratio:.2f}' for ratio in ratios)})")


if __name__ == "__main__":
    main()
