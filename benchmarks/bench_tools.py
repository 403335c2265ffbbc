"""Time the tools a user waits for on large graphs: `sanitize`, `sanitize(reorder=True)` and
`simulate(contention=True)` (issue 23, item 4), called as a user calls them (the garbage collector on).

    python benchmarks/bench_tools.py                         # stress shape, about 26k and 105k nodes
    python benchmarks/bench_tools.py --sizes 26000 105000 --shapes stress dag --repeat 2

Each graph is one of bench_passes.py's shapes run through `run_stream_passes` (the default, corrected passes), so the
sanitizer checks what streamnb's passes produce: wrapped syncs, every value ordered. Sizes are the node counts of that
processed graph (about; the `nodes` column prints the real count). For each size and mode it prints wall and CPU seconds
(`time.process_time`: this process only, less noisy on a shared machine), nodes per second, the verdict, and then per
mode the flatness: time per node at the largest size over time per node at the smallest (1.0 = linear; issue 23 asks
at most 5/4 = 1.25 for x4 nodes, i.e. x4 nodes -> at most x5 time), and the peak Python memory (tracemalloc, a
separate untimed run). Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_passes as B  # noqa: E402  (its shapes; it puts tests/ on the path)

from streamnb.pipeline import run_stream_passes  # noqa: E402
from streamnb.sanitizer import sanitize  # noqa: E402
from streamnb.simulator import Timeline, simulate  # noqa: E402

# processed nodes per unit of the shape builder's size (streamnb's default passes; measured at 20k-100k)
GROWTH = {"stress": 7.47, "dag": 11.55, "backward": 2.8}


def processed(shape: str, nodes: int):
    "A graph of `shape` with about `nodes` nodes after streamnb's default passes (a plain GraphModule)."
    make, _ = B.SHAPES[shape]
    n = max(10, round(nodes / GROWTH[shape]))
    gm = B.copy_as(make(n) if shape != "backward" else make(n, B.LAYER), "plain")
    return run_stream_passes(gm)


def timed(fn):
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    # What the tool made while it paused the collector is young: the caller's next allocation scans it (a
    # generation-0 collection). Run it before the clock stops, as bench_passes.py does, so its cost is counted.
    if gc.isenabled(): gc.collect(0)
    return out, time.perf_counter() - t0, time.process_time() - c0


def peak_mib(fn) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(GROWTH), default=["stress"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[26000, 105000])
    ap.add_argument("--repeat", type=int, default=1, help="keep each measurement's best of N")
    ap.add_argument("--no-memory", action="store_true")
    a = ap.parse_args(argv)
    modes = {"sanitize": sanitize, "sanitize(reorder=True)": lambda gm: sanitize(gm, reorder=True),
             "simulate(contention=True)": lambda gm: simulate(gm, contention=True)}
    print(f"{'shape':<8} {'nodes':>7} {'tool':<26} {'wall s':>7} {'cpu s':>7} {'nodes/s':>8} {'verdict':<10} {'peak MiB':>9}")
    per_node: dict = {}
    for shape in a.shapes:
        for size in a.sizes:
            gm = processed(shape, size)
            n = len(gm.graph.nodes)
            for name, tool in modes.items():
                best = None
                for _ in range(a.repeat):
                    rep, wall, cpu = timed(lambda: tool(gm))
                    best = (wall, cpu) if best is None or cpu < best[1] else best
                wall, cpu = best
                mem = "" if a.no_memory else f"{peak_mib(lambda: tool(gm)):9.0f}"
                verdict = (f"{rep.makespan_us:.1f} us" if isinstance(rep, Timeline) else
                           "ok" if rep.ok else f"{len(rep.errors)} errors")
                print(f"{shape:<8} {n:>7} {name:<26} {wall:7.2f} {cpu:7.2f} {n / cpu:8.0f} {verdict:<10} {mem:>9}", flush=True)
                per_node.setdefault((shape, name), []).append((n, cpu / n))
            del gm
    for (shape, name), pts in per_node.items():
        if len(pts) > 1:
            (n0, u0), (n1, u1) = pts[0], pts[-1]
            print(f"flatness {shape} {name}: cpu time per node at {n1} / at {n0}: {u1 / u0:.2f} "
                  f"(x{n1 / n0:.1f} nodes -> x{n1 * u1 / (n0 * u0):.1f} time)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
