"""benchmarks/isr.py runs end to end on tiny sizes (one round, a fraction of a second per
figure), so it cannot rot unnoticed: real processes (3 controllers + 3 brokers), both
topics, every mode and shape measured, the five tables printed. No figure is asserted: a
timed target belongs to the benchmark's own run (docs/BENCHMARKS.md), not here."""

from __future__ import annotations

from benchmarks import isr


def test_the_isr_benchmark_runs_every_mode_and_shape() -> None:
    figures = isr.run(rounds=1, seconds=0.2, batch=5)
    for mode in isr.MODES:
        for shape in isr.SHAPES:
            assert len(figures[(mode, shape)]) == 1 and figures[(mode, shape)][0] > 0
            assert len(figures[(mode, -shape)]) == 1
            assert figures[(f"{mode} own core", shape)][0] > 0  # (a fifth table)
            if mode != "unreplicated":  # (peer messages per request: a third table)
                assert len(figures[(f"{mode} messages", shape)]) == 1
                assert len(figures[(f"{mode} bytes", shape)]) == 1
        for role in isr.ROLES:  # (CPU per record by role, 1 partition: a fourth table)
            assert len(figures[(f"{mode} {role}", 0)]) == 1
            assert figures[(f"{mode} {role}", 0)][0] >= 0
    assert 0 < figures[("idle", 0)][0] < 6  # (cores the six processes use, no writes)
    assert len(figures[("new pages", 0)]) == 2  # (the page-cache probe, start and end)
    assert all(cost > 0 for cost in figures[("new pages", 0)])
    lines = isr.report(figures, 1, 0.2, 5)
    for mode in isr.MODES:
        rows = 4 if mode == "unreplicated" else 5
        assert sum(line.startswith(f"| {mode} |") for line in lines) == rows, (mode, lines)
    assert any(line.startswith("acks=0 sends refused") for line in lines)
    assert any(line.startswith("new page cache: ") for line in lines)
