"""What the key index costs to write and to query, this tree beside another one.

Each round builds a store of ``--records`` keyed records (100-byte bodies, ten records a
key, three queues) in a child process, then times indexing every record (the first
query runs the indexer over the whole log: the index write cost) and ``--queries``
seeded key queries (the lookup cost). The child runs once on this tree and once on
``--baseline`` (a checkout of another commit with its extension built in place), in
alternating order, round after round: only the ratios of one run mean anything here.
Times are the child's CPU time (``time.process_time``), not wall time: on a loaded
shared machine the wall clock mostly measures the wait for a core.

    python -m benchmarks.index_cost --baseline /tmp/main-checkout --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, random, sys, time
import mqlog
path, records, queries, impl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
keys = max(1, records // 10)
store = mqlog.open(path, implementation=impl, index_interval_ms=3_600_000,
                   segment_size_bytes=1 << 28)
body = b"m" * 100
put = store.put
for index in range(records):
    put("orders", body, index % 3, key=f"order-{index % keys}")
started = time.process_time()
store.query("orders", "order-0")
index_s = time.process_time() - started
rng = random.Random(2026)
sample = [f"order-{rng.randrange(keys)}" for _ in range(queries)]
started = time.process_time()
for key in sample:
    assert len(store.query("orders", key)) == 10
query_s = time.process_time() - started
store.close()
print(json.dumps({"index_rec_s": records / index_s, "query_s": queries / query_s}))
"""


def measure(tree: Path, work: Path, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        env = dict(os.environ, PYTHONPATH=str(tree))
        out = subprocess.run([sys.executable, "-c", CHILD, scratch, str(args.records),
                              str(args.queries), args.implementation], env=env, check=True,
                             capture_output=True, text=True, cwd=scratch).stdout
    return json.loads(out.splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.index_cost")
    parser.add_argument("--baseline", type=Path, required=True,
                        help="another checkout of mqlog, its extension built in place")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--queries", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--implementation", default="cython", choices=("cython", "python"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="mqlog-index-cost-",
                                 dir=os.environ.get("MQLOG_BENCH_DIR")))
    ratios: dict[str, list[float]] = {"index_rec_s": [], "query_s": []}
    figures: dict[str, list[float]] = {"index_rec_s": [], "query_s": []}
    for round_index in range(args.rounds):
        trees = [HERE, args.baseline][::1 if round_index % 2 == 0 else -1]
        got = {tree: measure(tree, work, args) for tree in trees}
        for name in ratios:
            ratios[name].append(got[HERE][name] / got[args.baseline][name])
            figures[name].append(got[HERE][name])
        print(f"round {round_index + 1}: " + ", ".join(
            f"{name} {got[HERE][name]:,.0f} vs {got[args.baseline][name]:,.0f}"
            for name in ratios), flush=True)
    os.rmdir(work)
    for name in ratios:
        print(f"{name}: this tree median {statistics.median(figures[name]):,.0f}/s, "
              f"ratio to baseline median {statistics.median(ratios[name]):.2f}x "
              f"(min {min(ratios[name]):.2f}x, max {max(ratios[name]):.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
