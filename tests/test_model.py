"""Property tests: the store agrees with a simple in-memory model, and the two cores agree.

The model is a dict of queues, each a list of (body, key, tags, properties). Random
sequences of put, put_batch, get, flush, truncate, close and reopen run against a real
store; after every step the store must show exactly what the model holds.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import mqlog
from tests.conftest import IMPLEMENTATIONS, SMALL

TOPICS = st.sampled_from(["a", "b", "orders.eu"])
QUEUES = st.integers(0, 2)
BODIES = st.binary(max_size=3000)
KEYS = st.one_of(st.none(), st.text(max_size=12).filter(lambda text: text != ""))
TAGS = st.one_of(st.none(), st.sampled_from(["TagA", "TagB", "ä"]))
PROPERTIES = st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.text(max_size=8),
                                                  max_size=3))


def _fields(record) -> tuple:
    return (record.body, record.key, record.tags, record.properties)


class StoreModel(RuleBasedStateMachine):
    implementation = "python"

    @initialize()
    def open_store(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="mqlog-model-"))
        self.store = mqlog.open(self.directory, implementation=self.implementation, **SMALL)
        self.queues: dict[tuple[str, int], list[tuple]] = {}
        self.ends: list[tuple[int, dict]] = []  # (record end position, queue sizes after it)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _remember(self, key: tuple[str, int], fields: tuple, end_position: int) -> None:
        self.queues.setdefault(key, []).append(fields)
        self.ends.append((end_position, {k: len(v) for k, v in self.queues.items()}))

    @rule(topic=TOPICS, queue_id=QUEUES, body=BODIES, key=KEYS, tags=TAGS, props=PROPERTIES)
    def put(self, topic, queue_id, body, key, tags, props) -> None:
        result = self.store.put(topic, body, queue_id=queue_id, key=key, tags=tags,
                                properties=props)
        assert result.offset == len(self.queues.get((topic, queue_id), []))
        self._remember((topic, queue_id), (body, key, tags, props or {}), result.end_position)

    @rule(topic=TOPICS, queue_id=QUEUES, bodies=st.lists(BODIES, min_size=1, max_size=20),
          tags=TAGS)
    def put_batch(self, topic, queue_id, bodies, tags) -> None:
        result = self.store.put_batch(topic, bodies, queue_id=queue_id, tags=tags)
        assert result.count == len(bodies)
        records = self.store.get(topic, queue_id, result.offset, len(bodies), 1 << 24)
        for body, record in zip(bodies, records, strict=True):
            self._remember((topic, queue_id), (body, None, tags, {}), record.end_position)

    @rule(data=st.data())
    def get_some(self, data) -> None:
        if not self.queues:
            return
        key = data.draw(st.sampled_from(sorted(self.queues)))
        expected = self.queues[key]
        offset = data.draw(st.integers(0, len(expected)))
        count = data.draw(st.integers(1, 50))
        records = self.store.get(key[0], key[1], offset, count, 1 << 24)
        assert [_fields(r) for r in records] == expected[offset:offset + count]

    @rule()
    def flush(self) -> None:
        self.store.flush()
        assert self.store.flushed_position == self.store.written_position

    @precondition(lambda self: self.ends)
    @rule(data=st.data())
    def truncate(self, data) -> None:
        index = data.draw(st.integers(-1, len(self.ends) - 1))
        position, sizes = (0, {}) if index < 0 else self.ends[index]
        self.store.truncate(position)
        self.queues = {key: items[:sizes.get(key, 0)] for key, items in self.queues.items()}
        del self.ends[index + 1:]

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = mqlog.open(self.directory, implementation=self.implementation, **SMALL)
        assert self.store.recovery_report.clean

    @invariant()
    def queues_match_the_model(self) -> None:
        if not hasattr(self, "store"):
            return
        for (topic, queue_id), expected in self.queues.items():
            assert self.store.max_offset(topic, queue_id) == len(expected)
            records = self.store.get(topic, queue_id, 0, 65_536, 1 << 26)
            assert [_fields(r) for r in records] == expected


MODEL_SETTINGS = settings(max_examples=25, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_store_agrees_with_the_model(implementation):
    machine = type(f"StoreModel_{implementation}", (StoreModel,),
                   {"implementation": implementation})
    MODEL_SETTINGS(machine).TestCase().runTest()


# --- the twin: both cores write byte-identical files -----------------------------------

OPERATION = st.one_of(
    st.tuples(st.just("put"), TOPICS, QUEUES, BODIES, KEYS, TAGS, PROPERTIES),
    st.tuples(st.just("batch"), TOPICS, QUEUES, st.lists(BODIES, min_size=1, max_size=8)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("epoch"), st.integers(0, 3)),
    st.tuples(st.just("reopen")),
)


def _run(implementation: str, directory: Path, operations: list) -> None:
    counter = itertools.count(1_700_000_000_000)
    clock = lambda: next(counter)  # noqa: E731 - the same time sequence for both cores
    store = mqlog.open(directory, implementation=implementation, clock_ms=clock, **SMALL)
    ends: list[int] = []
    try:
        for operation in operations:
            store = _apply(store, operation, ends, implementation, directory, clock)
    finally:
        store.close()


def _apply(store, operation, ends, implementation, directory, clock):
    kind = operation[0]
    if kind == "put":
        _, topic, queue_id, body, key, tags, props = operation
        ends.append(store.put(topic, body, queue_id, key, tags, props).end_position)
    elif kind == "batch":
        ends.append(store.put_batch(operation[1], operation[3], operation[2]).end_position)
    elif kind == "truncate" and ends:
        index = int(operation[1] * (len(ends) - 1))
        store.truncate(ends[index])
        del ends[index + 1:]
    elif kind == "epoch":
        store.set_epoch(store.epoch + operation[1])
    elif kind == "reopen":
        store.close()
        store = mqlog.open(directory, implementation=implementation, clock_ms=clock, **SMALL)
    return store


def _files(directory: Path) -> dict[str, bytes]:
    wanted = ("commitlog", "consumequeue")
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*"))
            if path.is_file() and path.relative_to(directory).parts[0] in wanted}


@pytest.mark.skipif("cython" not in IMPLEMENTATIONS, reason="the C extension is not built")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=st.lists(OPERATION, max_size=40))
def test_cython_and_python_write_identical_files(operations):
    root = Path(tempfile.mkdtemp(prefix="mqlog-twin-"))
    try:
        _run("cython", root / "c", operations)
        _run("python", root / "py", operations)
        c_files, py_files = _files(root / "c"), _files(root / "py")
        assert sorted(c_files) == sorted(py_files)
        for name in c_files:
            assert c_files[name] == py_files[name], f"{name} differs"
    finally:
        shutil.rmtree(root, ignore_errors=True)
