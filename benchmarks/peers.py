"""Peer adapters: the stores a Python user would pick instead of mqlog, behind one shape.

Each peer is a small class: ``open(root, durable)`` makes a fresh store in directory
``root``, ``put_batch(bodies)`` appends one batch (the harness uses batches of 1000),
``end_writes()`` pushes out what a fast writer still buffers (timed with the writes),
``read_all()`` reads every record back in write order and returns the count, and
``close()`` releases everything. ``missing()`` says why a peer cannot run here (its
module or program is absent), or None.

Two modes, the same for every peer:

* fast — what the peer does by default with its durability switched down: data reaches
  the page cache (or the server's memory), nothing waits for the disk.
* durable — every batch is on disk before ``put_batch`` returns: one fsync-class call
  per batch of 1000, each peer's own way (``DURABLE_MEANS`` says which).

Redis is a server: ``RedisServer`` starts ``redis-server`` on 127.0.0.1 on a free port
with its ``--dir`` in the store's directory and AOF on (``appendfsync always`` when
durable, ``no`` when fast), and stops it on close. The client is redis-py; a pipeline of
XADD commands is one batch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import mmap
import os
import shutil
import socket
import sqlite3
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, ClassVar

import mqlog

HEADER = struct.Struct("<I")  # the buffered file's length prefix
KEY = struct.Struct(">Q")  # big-endian counters sort in write order (LMDB, RocksDB)


def fresh(root: Path) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    return root


class Peer:
    name: ClassVar[str] = ""
    durable_means: ClassVar[str] = ""
    module: ClassVar[str | None] = None  # the Python module it needs, if any

    def __init__(self, root: Path, durable: bool) -> None:
        self.root, self.durable, self.count = root, durable, 0

    @classmethod
    def missing(cls) -> str | None:
        if cls.module and importlib.util.find_spec(cls.module) is None:
            return f"Python module {cls.module!r} is not installed (pip install '.[bench]')"
        return None

    @classmethod
    def open(cls, root: Path, durable: bool) -> Peer:
        return cls(fresh(root), durable)

    def put_batch(self, bodies: list[bytes]) -> None:
        raise NotImplementedError

    def end_writes(self) -> None:
        """Push out what the fast mode still buffers in this process (timed with writes)."""

    def read_all(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        """Release files, handles and processes."""


class MqlogPeer(Peer):
    name = "mqlog"
    durable_means = 'flush_mode="sync": put_batch returns once its group commit is durable'

    def __init__(self, root: Path, durable: bool, segment_size_bytes: int = 256 << 20) -> None:
        super().__init__(root, durable)
        self.store = mqlog.open(root, segment_size_bytes=segment_size_bytes,
                                flush_mode="sync" if durable else "async")

    @classmethod
    def open(cls, root: Path, durable: bool, segment_size_bytes: int = 256 << 20) -> Peer:
        return cls(fresh(root), durable, segment_size_bytes)

    def put_batch(self, bodies: list[bytes]) -> None:
        self.store.put_batch("bench", bodies)

    def read_all(self) -> int:
        get, offset, seen = self.store.get, 0, 0
        while batch := get("bench", 0, offset, 1000, 64 << 20):
            for record in batch:
                seen += len(record.body) > 0
            offset += len(batch)
        return seen

    def close(self) -> None:
        self.store.close()


class FilePeer(Peer):
    """The floor: length-prefixed records appended to one buffered file."""

    name = "buffered file"
    durable_means = "flush() + os.fdatasync() per batch"

    def __init__(self, root: Path, durable: bool) -> None:
        super().__init__(root, durable)
        self.path = root / "log"
        self.file = open(self.path, "wb")  # noqa: SIM115 (closed in close())

    def put_batch(self, bodies: list[bytes]) -> None:
        write, pack = self.file.write, HEADER.pack
        for body in bodies:
            write(pack(len(body)))
            write(body)
        if self.durable:
            self.file.flush()
            os.fdatasync(self.file.fileno())

    def end_writes(self) -> None:
        self.file.flush()

    def read_all(self) -> int:
        self.file.flush()
        with open(self.path, "rb") as file, \
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            unpack, position, end, seen = HEADER.unpack_from, 0, len(view), 0
            while position < end:
                (size,) = unpack(view, position)
                position += 4
                seen += len(view[position:position + size]) > 0
                position += size
        return seen

    def close(self) -> None:
        self.file.close()


class LmdbPeer(Peer):
    name = "LMDB"
    module = "lmdb"
    durable_means = "sync=True: each write transaction (one per batch) commits with fsync"

    def __init__(self, root: Path, durable: bool) -> None:
        import lmdb

        super().__init__(root, durable)
        self.env = lmdb.open(str(root), map_size=1 << 36, sync=durable, metasync=durable,
                             writemap=False)

    def put_batch(self, bodies: list[bytes]) -> None:
        pack, base = KEY.pack, self.count
        items = [(pack(base + i), body) for i, body in enumerate(bodies)]
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items, append=True)
        self.count += len(bodies)

    def read_all(self) -> int:
        seen = 0
        with self.env.begin() as txn:
            for _key, value in txn.cursor():
                seen += len(value) > 0
        return seen

    def close(self) -> None:
        self.env.close()


class RocksPeer(Peer):
    name = "RocksDB"
    module = "rocksdict"
    durable_means = "WriteBatch per batch, WriteOptions.sync=True (WAL fsync per batch)"

    def __init__(self, root: Path, durable: bool) -> None:
        from rocksdict import Options, Rdict, WriteOptions

        super().__init__(root, durable)
        self.db = Rdict(str(root), Options(raw_mode=True))
        options = WriteOptions()
        options.sync = durable
        self.db.set_write_options(options)

    def put_batch(self, bodies: list[bytes]) -> None:
        from rocksdict import WriteBatch

        batch, pack, base = WriteBatch(raw_mode=True), KEY.pack, self.count
        for i, body in enumerate(bodies):
            batch.put(pack(base + i), body)
        self.db.write(batch)
        self.count += len(bodies)

    def read_all(self) -> int:
        seen = 0
        for value in self.db.values():
            seen += len(value) > 0
        return seen

    def close(self) -> None:
        self.db.close()


class SqlitePeer(Peer):
    name = "SQLite WAL"
    durable_means = "synchronous=FULL: the WAL is fsynced at each commit (one per batch)"
    fast_means = "synchronous=NORMAL (WAL synced only at checkpoints)"

    def __init__(self, root: Path, durable: bool) -> None:
        super().__init__(root, durable)
        self.db = sqlite3.connect(root / "db", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")
        self.db.execute("CREATE TABLE log (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")

    def put_batch(self, bodies: list[bytes]) -> None:
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO log (body) VALUES (?)", [(b,) for b in bodies])
        self.db.execute("COMMIT")

    def read_all(self) -> int:
        seen = 0
        for (body,) in self.db.execute("SELECT body FROM log ORDER BY id"):
            seen += len(body) > 0
        return seen

    def close(self) -> None:
        self.db.close()


class RedisServer:
    """A private redis-server on 127.0.0.1: a free port, its files in ``directory``."""

    def __init__(self, directory: Path, fsync_always: bool) -> None:
        self.port = free_port()
        command = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                   "--dir", str(directory), "--appendonly", "yes",
                   "--appendfsync", "always" if fsync_always else "no",
                   "--save", "", "--daemonize", "no", "--logfile", str(directory / "log")]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def client(self, deadline_s: float = 10.0) -> Any:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        give_up = time.monotonic() + deadline_s
        while True:
            try:
                client.ping()
                return client
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > give_up:
                    self.stop()
                    raise RuntimeError("redis-server did not start; see its log") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisPeer(Peer):
    name = "Redis Streams"
    module = "redis"
    durable_means = "appendonly yes, appendfsync always (AOF fsync before each reply batch)"

    def __init__(self, root: Path, durable: bool) -> None:
        super().__init__(root, durable)
        self.server = RedisServer(root, fsync_always=durable)
        self.client = self.server.client()

    @classmethod
    def missing(cls) -> str | None:
        if shutil.which("redis-server") is None:
            return "redis-server is not on PATH"
        return super().missing()

    def put_batch(self, bodies: list[bytes]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for body in bodies:
            pipe.xadd("bench", {"b": body})
        pipe.execute()

    def read_all(self) -> int:
        seen, start = 0, "-"
        while entries := self.client.xrange("bench", min=start, max="+", count=1000):
            for _id, fields in entries:
                seen += len(fields[b"b"]) > 0
            start = b"(" + entries[-1][0]
        return seen

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()
        self.server.stop()


PEERS: tuple[type[Peer], ...] = (FilePeer, MqlogPeer, LmdbPeer, RocksPeer, SqlitePeer,
                                 RedisPeer)
