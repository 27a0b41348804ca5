"""A writer process for the crash tests: it writes a seeded stream of records and
acknowledges every stored one on stdout until the parent kills it with SIGKILL.

Usage::

    PYTHONPATH=<repository> python tests/crash_child.py STORE_DIR IMPL MODE SEED [ROUND [LIMIT]]

IMPL is the log core ("python" or "cython"), MODE the flush mode ("sync" or "async"; or
``TORN_MODE``: async with no checkpoint after the open's).
The child opens (and so recovers) the store, then each writer thread writes the plan
``writer_plan(SEED, ROUND, writer, writers, start_offsets, LIMIT)``, where the start
offsets are the queues' ends as the child found them. Sync mode runs several writers
(group commit under concurrency), async mode one; each queue has exactly one writer, so
what a queue should hold at every offset is fixed by the seed alone (``body_for`` and
``fields_for``), whatever the interleaving of threads and however many rounds of
crashes came before.

Protocol on stdout, one line per event, each written with one ``os.write`` (a line is
far below PIPE_BUF, so lines from different threads never interleave):

    READY <pid> <end_position>             the store is open, nothing written yet
    A <topic> <queue_id> <offset> <position> <size> <crc32 of body>
                                           the put (or put_batch) that stored this record
                                           returned PUT_OK
    T <topic> <queue_id> <offset>          the put returned another status (not an ack)
    DONE                                   every writer wrote its LIMIT records
    ERROR <text>                           a writer failed; the child exits with status 3

After DONE the child waits (bounded) to be killed; it never closes the store cleanly.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import zlib
from typing import NamedTuple

import msgpack

import mqlog
from mqlog.results import PutStatus

# The SMALL config of tests/conftest.py: small segments and queue files, so that rolls
# happen every few dozen records and checkpoints several times a second.
CONFIG = dict(segment_size_bytes=64 * 1024, message_size_bytes_max=16 * 1024,
              consume_queue_entries_per_file=64, checkpoint_interval_ms=50)
# An async writer is fast (a round takes tens of milliseconds): flush and checkpoint
# often enough that crashes land between checkpoints taken during the round.
ASYNC_CONFIG = dict(CONFIG, flush_interval_ms=2, checkpoint_interval_ms=5)
QUEUES = [(topic, queue_id) for topic in ("orders", "audit", "metrics") for queue_id in range(3)]
LIMIT_DEFAULT = 2_000  # records per writer per round
BATCH_COUNT_MAX = 6
RECORD_HEADER_SIZE = 72  # docs/FORMAT.md
BLANK_SIZE_MIN = 8
LINGER_S = 120  # after DONE: wait this long for the parent's SIGKILL, then exit anyway


class Op(NamedTuple):
    """One call a writer makes: a put (one body) or a put_batch (several)."""

    topic: str
    queue_id: int
    first_offset: int
    count: int
    batch: bool


# Async with no checkpoint after the one the open writes and no flushed position saved:
# everything a round writes lies past what recovery knows was durable (test_crash zeroes
# a page there, as a power loss may leave one unwritten; with the flushed position saved
# only the bytes past it could be).
TORN_MODE = "async-no-checkpoint"
TORN_CONFIG = dict(ASYNC_CONFIG, checkpoint_interval_ms=3_600_000,
                   flushed_position_save_interval_ms=-1)


def config_for(mode: str) -> dict:
    if mode == TORN_MODE:
        return dict(TORN_CONFIG, flush_mode="async")
    return dict(ASYNC_CONFIG if mode == "async" else CONFIG, flush_mode=mode)


def writers_for(mode: str) -> int:
    return 4 if mode == "sync" else 1


def queues_of(writer: int, writers: int) -> list[tuple[str, int]]:
    return [queue for index, queue in enumerate(QUEUES) if index % writers == writer]


def body_for(seed: int, topic: str, queue_id: int, offset: int) -> bytes:
    """The body of the record at ``offset`` of a queue: self-describing, varied in size."""
    rng = random.Random(f"body/{seed}/{topic}/{queue_id}/{offset}")
    roll = rng.random()
    if roll < 0.7:
        size = rng.randrange(0, 300)
    elif roll < 0.95:
        size = rng.randrange(300, 3_000)
    else:
        size = rng.randrange(3_000, 12_000)
    return f"{topic}/{queue_id}/{offset}|".encode() + rng.randbytes(size)


def fields_for(seed: int, topic: str, queue_id: int, first_offset: int,
               count: int) -> tuple[str | None, str | None, dict]:
    """(key, tags, properties) shared by the records of the op starting at ``first_offset``.

    The properties name the op (first offset, count), so a reader can check any record's
    key and tags without knowing how the ops fell."""
    rng = random.Random(f"fields/{seed}/{topic}/{queue_id}/{first_offset}")
    key = f"{topic}:{queue_id}:{first_offset}" if rng.random() < 0.5 else None
    tags = rng.choice((None, "red", "green", "blue"))
    return key, tags, {"first": first_offset, "count": count}


def writer_plan(seed: int, round_index: int, writer: int, writers: int,
                start_offsets: dict[tuple[str, int], int], limit: int) -> list[Op]:
    """The ops one writer makes in one round, ``limit`` records in all."""
    rng = random.Random(f"plan/{seed}/{round_index}/{writer}/{writers}")
    queues = queues_of(writer, writers)
    next_offset = {queue: start_offsets.get(queue, 0) for queue in queues}
    plan: list[Op] = []
    written = 0
    while written < limit:
        topic, queue_id = rng.choice(queues)
        batch = rng.random() < 0.2
        count = min(rng.randint(2, BATCH_COUNT_MAX) if batch else 1, limit - written)
        plan.append(Op(topic, queue_id, next_offset[(topic, queue_id)], count, batch))
        next_offset[(topic, queue_id)] += count
        written += count
    return plan


def record_size(topic: str, key: str | None, tags: str | None, properties: dict,
                body: bytes) -> int:
    """Bytes a record takes in the commit log (docs/FORMAT.md)."""
    return (RECORD_HEADER_SIZE + len(topic.encode()) + len((key or "").encode())
            + len((tags or "").encode()) + len(msgpack.packb(properties)) + len(body))


def batch_positions(first_position: int, sizes: list[int], segment_size: int) -> list[int]:
    """Positions of a batch's records: consecutive, except that a record which does not
    fit (with room for a blank record) in the rest of a segment opens the next one."""
    positions = [first_position]
    for previous, size in zip(sizes, sizes[1:], strict=False):
        position = positions[-1] + previous
        if position % segment_size + size + BLANK_SIZE_MIN > segment_size:
            position += segment_size - position % segment_size
        positions.append(position)
    return positions


class _Out:
    """stdout as whole lines, one os.write each, safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def emit(self, text: str) -> None:
        data = text.encode()
        with self._lock:
            while data:
                data = data[os.write(1, data):]


def _write(store: mqlog.Store, seed: int, plan: list[Op], out: _Out) -> None:
    segment_size = CONFIG["segment_size_bytes"]
    for op in plan:
        bodies = [body_for(seed, op.topic, op.queue_id, op.first_offset + index)
                  for index in range(op.count)]
        key, tags, properties = fields_for(seed, op.topic, op.queue_id, op.first_offset,
                                           op.count)
        if op.batch:
            result = store.put_batch(op.topic, bodies, op.queue_id, key, tags, properties)
            count = result.count
        else:
            result = store.put(op.topic, bodies[0], op.queue_id, key, tags, properties)
            count = 1
        if result.offset != op.first_offset or count != op.count:
            raise AssertionError(f"{op}: the store gave offset {result.offset}, count {count}")
        sizes = [record_size(op.topic, key, tags, properties, body) for body in bodies]
        if result.status is not PutStatus.PUT_OK:
            out.emit("".join(f"T {op.topic} {op.queue_id} {op.first_offset + index}\n"
                             for index in range(op.count)))
            continue
        positions = batch_positions(result.position, sizes, segment_size)
        out.emit("".join(
            f"A {op.topic} {op.queue_id} {op.first_offset + index} {positions[index]} "
            f"{sizes[index]} {zlib.crc32(bodies[index])}\n" for index in range(op.count)))


def main(argv: list[str]) -> None:
    store_dir, implementation, mode, seed = argv[1], argv[2], argv[3], int(argv[4])
    round_index = int(argv[5]) if len(argv) > 5 else 0
    limit = int(argv[6]) if len(argv) > 6 else LIMIT_DEFAULT
    out = _Out()
    store = mqlog.open(store_dir, implementation=implementation, **config_for(mode))
    starts = {queue: store.max_offset(*queue) for queue in QUEUES}
    writers = writers_for(mode)
    plans = [writer_plan(seed, round_index, writer, writers, starts, limit)
             for writer in range(writers)]
    out.emit(f"READY {os.getpid()} {store.recovery_report.end_position}\n")

    def run(plan: list[Op]) -> None:
        try:
            _write(store, seed, plan, out)
        except BaseException as error:  # report, then die at once: the parent fails the test
            try:
                out.emit(f"ERROR {error!r}".replace("\n", " ") + "\n")
            finally:
                os._exit(3)

    threads = [threading.Thread(target=run, args=(plan,)) for plan in plans]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.emit("DONE\n")
    time.sleep(LINGER_S)
    os._exit(0)  # never a clean close


if __name__ == "__main__":
    main(sys.argv)
