"""Where a store may be created: a new or empty directory, or one that holds no more than
what mqlog itself puts beside a store (new-user review, item 4).

`mqlog produce DIR` into any existing directory quietly made a store there: beside an
unrelated file (commitlog/, lock, meta.json ... mixed with the user's files), or inside
another store's commitlog/ (a whole store nested in it). Now an open for writing refuses
such a directory with NotAStoreDirectory, writing nothing, while an empty or missing
directory is created as before, and the files a broker prepares before a store's first
open (a partition's topic id, a node's hard state, the data_dir's lock) are accepted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import mqlog
from mqlog import config, errors
from mqlog.replication import hardstate
from tests.conftest import SMALL

MQLOG = Path(sys.executable).parent / "mqlog"


def _listing(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_a_directory_holding_other_files_is_refused_and_left_as_it_was(tmp_path, impl):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("mine")
    (junk / "photos").mkdir()
    with pytest.raises(errors.NotAStoreDirectory, match="is not an mqlog store and is not "
                       r"empty \(it holds notes.txt, photos\)") as raised:
        mqlog.open(junk, implementation=impl, **SMALL)
    assert raised.value.names == ["notes.txt", "photos"]
    assert isinstance(raised.value, errors.InvalidArgument)
    assert _listing(junk) == ["notes.txt", "photos"]  # no lock, no commitlog/, nothing
    with pytest.raises(errors.StoreNotFound):  # (read-only opens: as before)
        mqlog.open(junk, implementation=impl, read_only=True)


@pytest.mark.parametrize("inside", ["commitlog", "consumequeue/t/0", "index", "new/deeper"])
def test_a_directory_inside_a_store_is_refused(tmp_path, impl, inside):
    store = tmp_path / "store"
    with mqlog.open(store, implementation=impl, **SMALL) as opened:
        opened.put("t", b"x")
    before = _listing(store)
    with pytest.raises(errors.NotAStoreDirectory, match="lies inside the store") as raised:
        mqlog.open(store / inside, implementation=impl, **SMALL)
    assert raised.value.inside == str(store.resolve())
    assert _listing(store) == before
    link = tmp_path / "link"  # (a symbolic link into the store is inside it too)
    link.symlink_to(store / "commitlog")
    with pytest.raises(errors.NotAStoreDirectory, match="lies inside the store"):
        mqlog.open(link, implementation=impl, **SMALL)


def test_another_systems_commitlog_without_meta_json_is_refused_untouched(tmp_path, impl):
    """A RocketMQ-like directory (commitlog/ with a segment of foreign bytes, no
    meta.json) was opened as a store: recovery cut the foreign segment as a torn tail
    and zeroed it (helper-56). Refused now, every byte as it was; an empty commitlog/ (a
    first open cut short before meta.json) still opens."""
    foreign = tmp_path / "rocketmq"
    (foreign / "commitlog").mkdir(parents=True)
    segment = foreign / "commitlog" / "00000000000000000000"
    segment.write_bytes(b"\x7f" * 4096)
    with pytest.raises(errors.NotAStoreDirectory, match="commitlog/ with files but no "
                       "meta.json"):
        mqlog.open(foreign, implementation=impl, **SMALL)
    assert _listing(foreign) == ["commitlog", "commitlog/00000000000000000000"]
    assert segment.read_bytes() == b"\x7f" * 4096
    cut_short = tmp_path / "cut-short"
    (cut_short / "commitlog").mkdir(parents=True)
    with mqlog.open(cut_short, implementation=impl, **SMALL) as store:
        store.put("t", b"x")


def test_new_empty_and_existing_stores_open_as_before(tmp_path, impl):
    for path in (tmp_path / "new" / "with" / "parents", tmp_path / "empty"):
        if path.name == "empty":
            path.mkdir()
        with mqlog.open(path, implementation=impl, **SMALL) as opened:
            opened.put("t", b"x")
    (tmp_path / "empty" / "README").write_text("a store may hold a user's note")
    with mqlog.open(tmp_path / "empty", implementation=impl, **SMALL) as opened:
        assert opened.get("t", 0, 0, 1)[0].body == b"x"
    cut_short = tmp_path / "cut-short"  # a first open that died after the lock and dirs
    (cut_short / "commitlog").mkdir(parents=True)
    (cut_short / "lock").write_text("4242\n")
    (cut_short / "stray").write_text("")
    with mqlog.open(cut_short, implementation=impl, **SMALL) as opened:
        assert opened.written_position == 0


def test_what_mqlog_puts_beside_a_store_before_it_opens_is_accepted(tmp_path, impl):
    """A controller-assigned partition's directory gets its topic-id file before the store
    opens (replication/node.py), a single-group node's data_dir is its store and holds
    the node's hard state, a broker's lock and a crashed replace's temporary files."""
    directory = tmp_path / "orders-0"
    directory.mkdir()
    hardstate.save_topic_id(directory, 5206841772305361937)
    hardstate.save(directory, hardstate.HardState(term=3, vote="n2"))
    hardstate.save(directory, hardstate.RoleState("SLAVE", 2, master="m"))
    hardstate.save_high_watermark(directory, 0)
    (directory / "broker.lock").write_text("4242\n")
    (directory / "raft-state.tmp").write_text("torn")
    (directory / "checkpoint.tmp").write_bytes(b"torn")
    with mqlog.open(directory, implementation=impl, **SMALL) as opened:
        opened.put("t", b"x")
    assert hardstate.load_topic_id(directory) == 5206841772305361937
    data_dir = tmp_path / "broker"  # a cluster broker's marks (config.py)
    (data_dir / config.STRAYS_DIRECTORY).mkdir(parents=True)
    (data_dir / config.MEMBER_FILE).write_text("")
    with mqlog.open(data_dir, implementation=impl, **SMALL):
        pass


def test_the_names_accepted_are_those_mqlog_uses():
    """The engine imports nothing above it, so it names the replication layer's files
    itself: they must stay those hardstate.py and config.py write."""
    from mqlog.engine.store import BESIDE_STORE_NAMES, STORE_NAMES, StorePaths

    for name in (hardstate.FILE_NAME, hardstate.ROLE_FILE_NAME, hardstate.TOPIC_ID_FILE_NAME,
                 hardstate.HIGH_WATERMARK_FILE_NAME, config.MEMBER_FILE,
                 config.STRAYS_DIRECTORY):
        assert name in BESIDE_STORE_NAMES, name
    paths = StorePaths(Path("s"))
    own = {getattr(paths, name).name for name in dir(paths)
           if isinstance(getattr(type(paths), name, None), property)}
    assert own <= STORE_NAMES, own - STORE_NAMES


def test_produce_into_a_directory_that_is_not_a_store_is_one_error_line(tmp_path):
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "unrelated").write_text("")
    store = tmp_path / "store"
    for target in (junk, store / "commitlog"):
        if target.parent == store:
            subprocess.run([str(MQLOG), "produce", str(store), "-t", "t"], input="a\n",
                           text=True, check=True, capture_output=True, timeout=60)
        before = _listing(tmp_path)
        result = subprocess.run([str(MQLOG), "produce", str(target), "-t", "x"], input="hi\n",
                                text=True, capture_output=True, timeout=60)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("mqlog: error: "), result.stderr
        assert "not an mqlog store" in lines[0] or "lies inside the store" in lines[0]
        assert _listing(tmp_path) == before
