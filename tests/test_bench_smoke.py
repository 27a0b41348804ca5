"""The benchmark harness runs end to end on tiny sizes, so it cannot rot unnoticed.

`python -m benchmarks.compare --quick` runs every part (the engine rows, the peers, the
message-size, queue-count and latency sweeps) with tiny sizes and writes its report and
one PNG per sweep; here into tmp_path. Peers that are not installed are skipped with a
line, as in a real run.
"""

from __future__ import annotations

import pytest

from benchmarks import compare, peers, sweeps

pytest.importorskip("lmdb", reason="the bench extra (lmdb) is not installed")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    work, out = tmp_path_factory.mktemp("work"), tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MQLOG_BENCH_DIR", str(work))
        assert compare.main(["--quick", "--out", str(out)]) == 0
    return work, out, (out / "results-rows-peers-sizes-queues-latency-quick.md").read_text()


def test_compare_quick_prints_every_row(quick_run):
    work, _out, report = quick_run
    for row in compare._rows().values():
        assert f"| {row.name} |" in report
    assert "records per fsync" in report and "recovery scan:" in report
    assert list(work.iterdir()) == []  # it cleans up after itself


def test_every_sweep_has_a_table_and_a_plot(quick_run):
    _work, out, report = quick_run
    for title in ("Peers", "message size", "number of queues", "Sync-flush ack latency"):
        assert title in report
    assert report.count("| ratio (median) |") == 5  # the rows' table and one per sweep
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    for name in sweeps.SECTIONS:  # (a quick run's plots are its own: not the full run's)
        png = out / f"results-rows-peers-sizes-queues-latency-quick-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({png.name})" in report
        assert not (out / f"{name}.png").exists(), name


def test_every_peer_is_measured_or_skipped_with_a_reason(quick_run):
    _work, _out, report = quick_run
    for cls in peers.PEERS:
        measured = f"| {cls.name} | write, fast |" in report
        skipped = f"{cls.name}: skipped (" in report
        assert measured != skipped, cls.name
    for count in sweeps.QUICK_SWEEPS.queue_counts:
        assert f"| {count:,} | mqlog | write |" in report
    for tasks in sweeps.QUICK_SWEEPS.concurrencies:
        assert f"| {tasks} | p99.9 |" in report


def test_a_missing_peer_is_skipped_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peers.LmdbPeer, "module", "no_such_module_for_mqlog_tests")
    monkeypatch.setattr(peers, "PEERS", (peers.FilePeer, peers.LmdbPeer))
    section = sweeps.peers_section(sweeps.QUICK_SWEEPS, 1, tmp_path)
    lines = [line for line in capsys.readouterr().err.splitlines() if "LMDB" in line]
    assert lines == ["peers: skipping LMDB: Python module 'no_such_module_for_mqlog_tests' "
                     "is not installed (pip install '.[bench]')"]
    assert any("LMDB: skipped" in line for line in section.lines)
    assert not any(line.startswith("| LMDB |") for line in section.lines)


def test_a_partial_run_never_overwrites_the_full_page(tmp_path, monkeypatch):
    """Issue 14: ``--only rows`` overwrote docs/bench/results.md's full sweep with the
    rows alone. A subset or a quick run writes a page of its own."""
    monkeypatch.setattr(compare, "report", lambda args, work: f"report of {args.only}")
    (tmp_path / "results.md").write_text("the full sweep\n")
    assert compare.main(["--only", "rows", "--out", str(tmp_path)]) == 0
    assert compare.main(["--only", "latency,rows", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text() == "the full sweep\n"
    assert (tmp_path / "results-rows.md").read_text() == "report of ['rows']\n"
    assert (tmp_path / "results-rows-latency-quick.md").exists()
    assert compare.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "results.md").read_text().startswith("report of ['rows', ")


def _fake_peers_section(sizes, rounds, work):
    """The peers sweep's section with made-up figures (no measuring): its real plot."""
    figures = {(name, what): sweeps.Figure([1e6 * (index + 1)], [1e6])
               for index, name in enumerate(("file", "mqlog"))
               for what in sweeps.PEER_FIGURES}
    return sweeps.Section("peers", "Peers", ["a table"],
                          lambda target: sweeps.plot_peers(figures, target))


def test_a_partial_run_never_overwrites_the_full_runs_plots(tmp_path, monkeypatch):
    """A quick run wrote docs/bench/peers.png (and the other sweeps' plots), the full
    sweep's, which results.md shows beside its own tables. A quick or partial run's
    page now links plots of its own, named after the page; only the full run draws
    ``<sweep>.png``."""
    pytest.importorskip("matplotlib", reason="the bench extra (matplotlib) is not installed")
    monkeypatch.setattr(sweeps, "SECTIONS", {"peers": _fake_peers_section})
    monkeypatch.setattr(compare, "PARTS", ("rows", "peers"))
    full_plot = tmp_path / "peers.png"
    full_plot.write_bytes(b"the full sweep's plot")
    for argv, page in ((["--quick"], "results-peers-quick.md"), ([], "results-peers.md")):
        assert compare.main([*argv, "--only", "peers", "--out", str(tmp_path)]) == 0
        report = (tmp_path / page).read_text()
        linked = tmp_path / (page.removesuffix(".md") + "-peers.png")
        assert f"]({linked.name})" in report, report
        assert linked.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert full_plot.read_bytes() == b"the full sweep's plot"
    monkeypatch.setattr(compare, "PARTS", ("peers",))  # now --only peers is every part:
    assert compare.main(["--out", str(tmp_path)]) == 0  # the full run draws peers.png
    assert "](peers.png)" in (tmp_path / "results.md").read_text()
    assert full_plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_main_rejects_an_unknown_part():
    with pytest.raises(SystemExit):
        compare.main(["--quick", "--only", "rows,nonsense"])


def test_the_raft_benchmark_runs_every_mode(capsys):
    """benchmarks/raft.py, briefly, without PySyncObj: a row per mode and cluster."""
    from benchmarks import raft

    assert raft.main(["--seconds", "0.3", "--sizes", "3", "--no-pysyncobj"]) == 0
    table = capsys.readouterr().out
    for mode in raft.MODES:
        assert f"| {mode} | single node |" in table and f"| {mode} | raft 3 nodes |" in table
