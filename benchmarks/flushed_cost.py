"""What saving the flushed position costs sync puts, against not saving it, same run.

``flushed_position_save_interval_ms`` = -1 (never: the store before the flushed-position
file), 0 (after every log sync: the default) and 10 (at most every 10 ms) are run in
turn, round after round, each on a new store: one thread doing sync ``put`` (every put
is its own log sync, so every put pays a save at 0), and ``--threads`` threads doing
sync ``put`` at once (group commit: one save per shared sync); each setting goes first
in turn. Figures are acknowledged
records a second (wall time: a sync waits for the disk); on a loaded shared machine
only the ratios within a round mean anything, and the medians of those are printed.

    python -m benchmarks.flushed_cost --rounds 7 --records 2000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import mqlog

SETTINGS = (-1, 0, 10)  # flushed_position_save_interval_ms; -1 is the baseline


def _rate(root: Path, interval: int, threads: int, records: int) -> float:
    """Acknowledged records a second of ``threads`` threads doing sync puts."""
    with mqlog.open(root, flush_mode="sync", segment_size_bytes=1 << 26,
                    flushed_position_save_interval_ms=interval) as store:
        each = records // threads
        body = b"m" * 100

        def writer(queue_id: int) -> None:
            for _ in range(each):
                store.put("t", body, queue_id)

        workers = [threading.Thread(target=writer, args=(index,)) for index in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return each * threads / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--dir", default=None, help="where the stores go (default: tmp)")
    options = parser.parse_args()
    ratios: dict[tuple[int, int], list[float]] = {}
    rates: dict[tuple[int, int], list[float]] = {}
    with tempfile.TemporaryDirectory(dir=options.dir) as work:
        for round_index in range(options.rounds):
            for threads in (1, options.threads):
                got = {}
                shift = round_index % len(SETTINGS)  # each setting first in turn
                for interval in SETTINGS[shift:] + SETTINGS[:shift]:
                    path = Path(work) / f"r{round_index}-t{threads}-i{interval}"
                    got[interval] = _rate(path, interval, threads, options.records)
                    rates.setdefault((threads, interval), []).append(got[interval])
                for interval in SETTINGS[1:]:
                    ratios.setdefault((threads, interval), []).append(got[interval] / got[-1])
    print(f"{'threads':>7} {'interval_ms':>11} {'median rec/s':>12} {'ratio vs -1':>11}")
    for threads in (1, options.threads):
        for interval in SETTINGS:
            ratio = statistics.median(ratios[(threads, interval)]) if interval >= 0 else 1.0
            rate = statistics.median(rates[(threads, interval)])
            print(f"{threads:>7} {interval:>11} {rate:>12,.0f} {ratio:>10.2f}x")


if __name__ == "__main__":
    main()
