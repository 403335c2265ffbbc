"""What the checks of the five public passes cost (issue 50, item 2), at about 100k final nodes.

    python benchmarks/bench_checks.py                              # shapes backward stress dag, 100000 final nodes
    python benchmarks/bench_checks.py --shapes dag --sizes 10000 100000 --repeat 5

Each public pass is a `graph.stream_pass`: before the pass's own work it refuses a non-GraphModule, skips a graph
already processed (`already_processed`), takes the transaction's snapshot (`_Snapshot`), runs `validate` and its
`check` (`check_stream_ops` for the first pass; the syncs, dealloc, epilogue and wrap passes decode the stream ops
themselves with `check_stream_ops` too, and use what it returns); after it, it marks the nodes the pass inserted and
the graph (`mark_processed`). This script runs the five passes each called alone (as bench_passes.py does; the
collector off as in its `like` headline, `--gc-on` for its `aot` path), on bench_passes.py's shapes, and prints per
check the CPU seconds it took over the five calls, the number of calls, and `around`: each public call's time minus the time of the function it wraps (`stream_pass`'s
whole cost: the checks, the snapshot, the marks, the collector's pause). Each measurement runs `--repeat` times in
turn (upstream, default, upstream, ...) on fresh copies; the median and the spread (min-max) are printed.

`check_stream_ops` inside a pass body is partly the pass's own decoding (it uses the ops it returns), so it is
printed on its own line, apart from the checks `stream_pass` runs. Nothing is asserted on time.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_passes as B  # noqa: E402  (also puts tests/ on the path and honours STREAMNB_SRC)

import streamnb.graph as G  # noqa: E402
import streamnb.pipeline as P  # noqa: E402
import streamnb.streamops as SO  # noqa: E402

clock = B.clock = time.process_time   # CPU seconds, here and in bench_passes' per-pass timers
ROWS = ("streamnb upstream", "streamnb default")


def checks() -> dict:
    "name -> the function, as `streamnb.graph` and `streamnb.streamops` define it now (absent ones left out)."
    names = {"already_processed": G, "validate": G, "require_val": G, "_Snapshot": G, "mark_processed": G,
             "check_stream_ops": SO, "_checked": G, "_fused_checks": G}
    return {k: getattr(m, k) for k, m in names.items() if hasattr(m, k)}


def run_counting(row: str, gm, gc_on: bool = False) -> tuple[float, dict, collections.Counter, float]:
    """Run `row`'s five passes alone on `gm` (`gc.disable()` around them, as bench_passes' `like`; `gc_on`: the
    collector on and the gen-0 collection after, as its `aot`); (total s, check name -> s, calls, s around the
    passes: each public call minus the function it wraps)."""
    spent, calls, inner = collections.defaultdict(float), collections.Counter(), [0.0]
    fns = checks()
    def timed(name, f):
        def run(*a, **k):
            calls[name] += 1
            t0 = clock()
            try: return f(*a, **k)
            finally: spent[name] += clock() - t0
        return run
    with contextlib.ExitStack() as patches:
        for mod in [m for name, m in sys.modules.items() if name.split(".")[0] == "streamnb"]:
            for attr, value in list(vars(mod).items()):
                for name, f in fns.items():
                    if value is f: patches.enter_context(mock.patch.object(mod, attr, timed(name, f)))
        for pname, public in P.STREAM_PASSES.items():   # the function each stream_pass wraps, timed inside it
            cells = dict(zip(public.__code__.co_freevars, public.__closure__ or ()))
            if "fn" not in cells: continue
            fn = cells["fn"].cell_contents
            def body(*a, _fn=fn, **k):
                t0 = clock()
                try: return _fn(*a, **k)
                finally: inner[0] += clock() - t0
            patches.callback(setattr, cells["fn"], "cell_contents", fn)
            cells["fn"].cell_contents = body
        gc.collect()
        if not gc_on: gc.disable()
        try:
            times: dict = {}
            t0 = clock()
            B.ALONE[row](gm, times)
            if gc_on: gc.collect(0)
            total = clock() - t0
        finally: gc.enable()
    passes = sum(times.values())
    return total, dict(spent), calls, passes - inner[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(B.SHAPES), default=list(B.SHAPES))
    ap.add_argument("--sizes", type=int, nargs="+", default=[100000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    ap.add_argument("--gc-on", action="store_true", help="the collector on (the aot path; `around` then includes the "
                                                          "young collection each call's end triggers)")
    a = ap.parse_args(argv)
    print(B.describe_code(), flush=True)
    print(f"\nCPU seconds over the five public calls, median of {a.repeat} interleaved runs [min-max]; collector "
          + ("on" if a.gc_on else "off (gc.disable() around the five calls)"))
    for shape in a.shapes:
        for size in a.sizes:
            base = B.build(shape, size)
            res = {row: [] for row in a.rows}
            for _ in range(a.repeat):
                for row in a.rows:
                    gm = B.copy_as(base, "lazy")
                    res[row].append((*run_counting(row, gm, a.gc_on), len(gm.graph.nodes)))
                    del gm
            for row in a.rows:
                runs = res[row]
                med = lambda xs: f"{statistics.median(xs):6.3f} [{min(xs):.3f}-{max(xs):.3f}]"
                names = sorted({k for r in runs for k in r[1]})
                out = runs[0][4]
                print(f"\n{shape} {size}: {len(base.graph.nodes)} in, {out} out, {row}: total {med([r[0] for r in runs])}")
                for k in names:
                    print(f"  {k:<20} {med([r[1].get(k, 0.0) for r in runs])}  x{runs[0][2][k]}")
                print(f"  {'around the passes':<20} {med([r[3] for r in runs])}  (each public call minus the "
                      "function it wraps: checks, snapshot, marks)")
                print(f"  {'checks per 100k':<20} {statistics.median([r[3] for r in runs]) / out * 1e5:6.3f}  (around, "
                      "per 100k final nodes)", flush=True)
            del base
    return 0


if __name__ == "__main__":
    sys.exit(main())
