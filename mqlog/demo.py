"""`make demo`: the embedded store, end to end, with figures.

1. write records one by one and in batches into a fresh store;
2. close it, reopen it (a clean open scans nothing) and read every record back;
   then queries: by key, by tag, by time, a consumer group's commit, retention;
3. sync flush: many producer threads, then many asyncio tasks, share group commits;
4. crash: a child process writing with sync flush is killed with SIGKILL; reopening
   recovers, and every record the child saw acknowledged is there;
5. replication: a SYNC_MASTER with two slaves, as real `mqlog node` processes on
   127.0.0.1; the master is SIGKILLed and restarted; every acknowledged record is on
   all three replicas (read back through read-only snapshots);
6. Spark: the three replicas are read as DataFrames and reconciled: no differences;
7. Raft: three node processes elect a leader; under writes the leader is SIGKILLed, the
   others elect a new one, and the client's retries (idempotent) store nothing twice:
   the time from the kill to the next acknowledged write is printed;
8. ISR (Kafka's replication): three controllers and three brokers as processes, a topic
   of 3 partitions x RF 3 with min_insync_replicas 2, acks=all writes through a
   ClusterClient; a partition's leader broker is SIGKILLed under writes, the controller
   elects a leader from the ISR, the broker restarts and rejoins the ISR; every
   acknowledged record is read back once.

Run ``python -m mqlog.demo [--records N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

import mqlog

BODY = b"m" * 100
console = Console()


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds / 1e6:.2f} M rec/s" if seconds > 0 else "-"


def write_and_read(directory: Path, records: int, table: Table) -> None:
    singles = records // 5
    with mqlog.open(directory, segment_size_bytes=256 << 20) as store:
        started = time.perf_counter()
        for index in range(singles):
            store.put("demo", BODY, queue_id=index & 7)
        table.add_row("put, one record per call", f"{singles:,}",
                      _rate(singles, time.perf_counter() - started))
        batches = (records - singles) // 1000
        started = time.perf_counter()
        bodies = [BODY] * 1000
        for index in range(batches):
            store.put_batch("demo", bodies, queue_id=index & 7)
        table.add_row("put_batch, 1000 per call", f"{batches * 1000:,}",
                      _rate(batches * 1000, time.perf_counter() - started))
        total = singles + batches * 1000
    started = time.perf_counter()
    with mqlog.open(directory, segment_size_bytes=256 << 20) as store:
        report = store.recovery_report
        table.add_row("reopen after clean close", "", f"{report.duration_ms:.1f} ms, "
                      f"{report.records_scanned} records scanned")
        started = time.perf_counter()
        seen = 0
        for queue_id in range(8):
            offset = 0
            while batch := store.get("demo", queue_id, offset, 1000, 1 << 24):
                seen += sum(len(record.body) == 100 for record in batch)
                offset = batch[-1].offset + 1
        table.add_row("get, 1000 per call (CRC checked)", f"{seen:,}",
                      _rate(seen, time.perf_counter() - started))
    assert seen == total, f"read back {seen} of {total} records"


def queries(directory: Path, table: Table, records: int = 200_000) -> None:
    """Keys, tags, time, a consumer group and retention on one store."""
    with mqlog.open(directory, segment_size_bytes=8 << 20, retention_ms=-1,
                    retention_bytes=16 << 20) as store:
        started = time.perf_counter()
        for index in range(records):
            store.put("orders", BODY, queue_id=index % 4, key=f"order-{index % 20_000}",
                      tags=("created", "paid", "shipped")[index % 3])
        table.add_row("put with key and tags", f"{records:,}",
                      _rate(records, time.perf_counter() - started))
        started = time.perf_counter()
        hits = store.query("orders", "order-4242")
        elapsed_ms = (time.perf_counter() - started) * 1000
        assert [r.key for r in hits] == ["order-4242"] * (records // 20_000)
        table.add_row("query by key (indexes the log first)", f"{len(hits)} hits",
                      f"{elapsed_ms:.1f} ms")
        paid = store.pull("orders", 1, 0, max_count=1000, tags="paid || shipped")
        assert all(r.tags in ("paid", "shipped") for r in paid.records)
        middle = store.get("orders", 2, store.max_offset("orders", 2) // 2, 1)[0]
        found = store.offset_for_timestamp("orders", 2, middle.store_timestamp)
        assert found <= middle.offset
        store.commit_offset("billing", "orders", 1, paid.next_offset)
        table.add_row("tag filter, then a consumer group commit", f"{len(paid.records)}",
                      f"billing lag on queue 1: {store.lag('billing')[('orders', 1)]:,}")
        store.flush()
        report = store.apply_retention()
        table.add_row("retention (keep 16 MiB)", f"{len(report.segments_deleted)} segments",
                      f"log starts at {report.log_start:,}; queue 0 starts at offset "
                      f"{store.min_offset('orders', 0):,}")


def replicated_cluster(directory: Path, table: Table, records: int = 2000) -> None:
    """A SYNC_MASTER and two slaves as real processes; the master is SIGKILLed and
    restarted; every acknowledged record must be on all three replicas."""
    from mqlog.replication.local import LocalCluster

    cluster = LocalCluster(directory, "SYNC_MASTER", slave_count=2,
                           store_settings="segment_size_bytes = 16777216")
    acked: list[tuple[int, bytes]] = []
    with cluster:
        started = time.perf_counter()
        with mqlog.Client(cluster.address("m")) as client:
            for index in range(records):
                body = f"replicated-{index}".encode()
                result = client.produce("orders", body, queue_id=index % 4)
                assert result.status is mqlog.PutStatus.PUT_OK, result.status
                acked.append((result.position, body))
        rate = records / (time.perf_counter() - started)
        cluster.kill("m")
        cluster.start("m")
        cluster.wait_converged()
    missing = 0
    for name in cluster.names:
        with mqlog.open(directory / name, read_only=True) as replica:
            missing += sum(replica.read_record(position).body != body
                           for position, body in acked)
    table.add_row("SYNC_MASTER + 2 slaves (processes), master SIGKILLed and restarted",
                  f"{records:,} acked", f"{rate / 1e3:.1f} k rec/s one client; "
                  f"{missing} acked records missing on any replica")
    assert missing == 0, f"{missing} acknowledged records missing"


def raft_failover(directory: Path, table: Table, records: int = 600) -> None:
    """A 3-node Raft group: the leader is SIGKILLed halfway through the writes; the
    unavailability window, and every acknowledged record on the survivors, once."""
    from mqlog.replication.local import LocalRaftCluster

    cluster = LocalRaftCluster(directory, 3)
    acked: dict[bytes, int] = {}
    with cluster:
        killed = cluster.wait_leader()
        with mqlog.GroupClient(cluster.addresses, timeout_s=2) as client:
            for index in range(records):
                if index == records // 2:
                    cluster.kill(killed)
                    lost_at = time.perf_counter()
                body = f"raft-{index}".encode()
                acked[body] = client.produce("orders", body).position
                if index == records // 2:
                    window_ms = (time.perf_counter() - lost_at) * 1000
            retries = client.retries
        cluster.wait_converged()
        leader = cluster.wait_leader()
        term = cluster.metadata(leader)["term"]
    survivors = [name for name in cluster.names if name != killed]
    missing = duplicates = 0
    for name in survivors:
        with mqlog.open(directory / name, read_only=True) as replica:
            missing += sum(replica.read_record(position).body != body
                           for body, position in acked.items())
            bodies = [record.body for record in replica.get("orders", 0, 0, 10_000)]
            duplicates += len(bodies) - len(set(bodies))
    table.add_row("Raft, 3 nodes (processes), leader SIGKILLed under writes",
                  f"{records:,} acked", f"{leader} leads term {term}; write stalled "
                  f"{window_ms:.0f} ms, {retries} retries; {missing} acked missing, "
                  f"{duplicates} stored twice")
    assert missing == 0 and duplicates == 0, (missing, duplicates)


def isr_failover(directory: Path, table: Table, records: int = 600) -> None:
    """Three controllers and three brokers; partition 0's leader broker is SIGKILLed
    halfway through acks=all writes and restarted: the write stall, the new leader, the
    ISR whole again, and every acknowledged record read back once."""
    from mqlog.cluster_client import ClusterClient
    from mqlog.replication import local_controller as local
    from mqlog.replication.local import wait_until

    with local.started(directory, session_ms=1500,
                       controller="min_insync_replicas = 2") as (addresses, processes):
        controllers = [addresses[name] for name in local.CONTROLLERS]
        local.ask(controllers, {"kind": "create_topic", "name": "orders", "partitions": 3,
                                "replication_factor": 3, "layer": "isr"})
        acked: dict[bytes, tuple[int, int]] = {}
        with ClusterClient([addresses[name] for name in local.BROKERS],
                           retry_timeout_s=60) as client:
            for index in range(records):
                if index == records // 2:
                    killed = client.metadata(refresh=True).partition("orders", 0).leader
                    processes[killed].kill()
                    processes[killed].wait()
                    lost_at = time.perf_counter()
                body = f"isr-{index}".encode()
                acked[body] = (index % 3, client.produce("orders", body,
                                                         partition=index % 3).offset)
                if index == records // 2:
                    window_ms = (time.perf_counter() - lost_at) * 1000
            retries = client.retries
            leader = client.metadata(refresh=True).partition("orders", 0).leader
            processes[killed] = local.start(directory, killed)
            wait_until(lambda: len(client.metadata(refresh=True).partition("orders", 0).isr)
                       == 3, f"{killed} back in the ISR", 60)
            stored = [(partition, record) for partition in range(3)
                      for record in client.fetch("orders", partition, 0, 10_000, 1 << 24)]
    read = {record.body: (partition, record.offset) for partition, record in stored}
    missing = sum(read.get(body) != place for body, place in acked.items())
    duplicates = len(stored) - len(read)
    table.add_row("ISR: 3 controllers + 3 brokers (processes), RF 3, acks=all; a leader "
                  "SIGKILLed under writes, restarted", f"{records:,} acked",
                  f"{leader} leads after {killed}; write stalled {window_ms:.0f} ms, "
                  f"{retries} retries; {killed} back in the ISR; {missing} acked missing, "
                  f"{duplicates} stored twice")
    assert missing == 0 and duplicates == 0, (missing, duplicates)


def reconcile_through_spark(directory: Path, table: Table) -> None:
    """Read the three replicas of the cluster step as DataFrames and reconcile them."""
    try:
        from mqlog.spark_connector import register
        from mqlog.spark_connector.cli import session
        from mqlog.spark_connector.reconcile import reconcile
    except ImportError:
        table.add_row("reconcile the replicas through Spark", "", "skipped: install the "
                      "spark extra (pip install -e '.[spark]')")
        return
    started = time.perf_counter()
    spark = session("mqlog demo", "local[2]", verbose=False)  # Spark's own log: to a file
    try:
        register(spark)  # (the "mqlog" format: small replicas are reconciled without it)
        replicas = [str(directory / name) for name in ("m", "s1", "s2")]
        found = reconcile(spark, replicas)
        findings = found.findings.count()
        rows = spark.read.format("mqlog").option("path", replicas[0]).load().count()
    finally:
        spark.stop()
    table.add_row("read the 3 replicas as DataFrames (local[2]) and reconcile them",
                  f"{rows:,} rows",
                  f"{findings} differences in {time.perf_counter() - started:.1f} s")
    assert findings == 0, f"the replicas differ: {findings} findings"


def group_commit(directory: Path, table: Table, threads: int = 64, each: int = 300) -> None:
    with mqlog.open(directory, flush_mode="sync", segment_size_bytes=64 << 20) as store:
        def produce(worker: int) -> None:
            for _ in range(each):
                assert store.put("sync", BODY, queue_id=worker % 4).status.name == "PUT_OK"

        workers = [threading.Thread(target=produce, args=(w,)) for w in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
        total = threads * each
        table.add_row(f"sync put, {threads} threads (group commit)", f"{total:,}",
                      f"{_rate(total, elapsed)}, {total / max(1, store.flush_count):.0f} "
                      "records per fsync")


def group_commit_asyncio(directory: Path, table: Table, tasks: int = 256,
                         each: int = 100) -> None:
    with mqlog.open(directory, flush_mode="sync", segment_size_bytes=64 << 20) as store:
        async def produce(worker: int) -> None:
            for _ in range(each):
                result = await store.put_async("sync", BODY, queue_id=worker % 4)
                assert result.status.name == "PUT_OK"

        async def main() -> None:
            await asyncio.gather(*(produce(w) for w in range(tasks)))

        started = time.perf_counter()
        asyncio.run(main())
        elapsed = time.perf_counter() - started
        total = tasks * each
        table.add_row(f"sync put_async, {tasks} asyncio tasks", f"{total:,}",
                      f"{_rate(total, elapsed)}, {total / max(1, store.flush_count):.0f} "
                      "records per fsync")


def crash_and_recover(directory: Path, table: Table) -> None:
    child = subprocess.Popen([sys.executable, "-m", "mqlog.demo", "--child", str(directory)],
                             stdout=subprocess.PIPE, text=True)
    acked: list[tuple[int, int]] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            offset, position = map(int, line.split())
            acked.append((offset, position))
            if len(acked) == 2000:
                child.send_signal(signal.SIGKILL)
                break
    finally:
        child.kill()
        child.wait()
    with mqlog.open(directory, flush_mode="sync", segment_size_bytes=64 << 20) as store:
        report = store.recovery_report
        stored = {r.offset: r.position for r in store.get("crash", 0, 0, 65_536, 1 << 26)}
        missing = [offset for offset, position in acked if stored.get(offset) != position]
        table.add_row("SIGKILL mid-write, then reopen", f"{len(acked):,} acked",
                      f"{report.records_scanned:,} records scanned in "
                      f"{report.duration_ms:.1f} ms; {len(missing)} acked records missing")
    assert not missing, f"acknowledged records lost: {missing[:10]}"


def child(directory: Path) -> None:
    """Write forever with sync flush, printing each acknowledged record."""
    with mqlog.open(directory, flush_mode="sync", segment_size_bytes=64 << 20) as store:
        while True:
            result = store.put("crash", BODY)
            print(result.offset, result.position, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (temporary)")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return
    work = args.dir or Path(tempfile.mkdtemp(prefix="mqlog-demo-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    console.print(f"[bold]mqlog demo[/bold] — core: {mqlog.IMPLEMENTATION}, "
                  f"{os.cpu_count()} cores, data in {work}"
                  + ("" if args.dir else " (removed at the end; --dir DIR keeps it)"))
    table = Table("step", "records", "result")
    steps = [("the embedded store: write, reopen, read back",
              lambda: write_and_read(work / "embedded", args.records, table)),
             ("keys, tags, time, consumer groups, retention",
              lambda: queries(work / "queries", table)),
             ("sync flush: group commit from threads",
              lambda: group_commit(work / "sync", table)),
             ("sync flush: group commit from asyncio tasks",
              lambda: group_commit_asyncio(work / "sync-asyncio", table)),
             ("a writer SIGKILLed, then recovery", lambda: crash_and_recover(work / "crash",
                                                                            table)),
             ("master-slave processes, the master SIGKILLed",
              lambda: replicated_cluster(work / "cluster", table)),
             ("Spark: the replicas as DataFrames, reconciled",
              lambda: reconcile_through_spark(work / "cluster", table)),
             ("Raft processes, the leader SIGKILLed under writes",
              lambda: raft_failover(work / "raft", table)),
             ("ISR: controllers and brokers, a leader SIGKILLed under writes",
              lambda: isr_failover(work / "isr", table))]
    try:
        for index, (what, run) in enumerate(steps, 1):
            console.print(f"[dim]{index}/{len(steps)} {what}...[/dim]")  # (it takes a while)
            run()
    finally:
        console.print(table)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    console.print("[green]every record written was read back; no acknowledged record lost[/]")


if __name__ == "__main__":
    main()
