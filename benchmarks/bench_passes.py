"""Time streamnb's stream passes against PyTorch's own on big backward-like graphs.

For each size, one generated graph (tests/graphgen.py, fast path: shared meta values; 3 streams, unannotated
nodes, gradient accumulations, fan-out, user syncs) is copied for every run, and on the copies we time:

* torch:      PyTorch 2.13's passes (the seed variant, run on the CPU with the oracle's stubs, "gpu" mode),
              pass by pass, in graph_capture.py's order;
* upstream:   streamnb with upstream=True, pass by pass, then the whole `run_stream_passes`;
* default:    streamnb's corrected passes via `run_stream_passes(gm)`.

Times are wall-clock seconds (best of --repeat). Nothing is asserted. `--profile` runs cProfile on streamnb's
default pipeline at the largest size and prints the top functions by cumulative time.

    python benchmarks/bench_passes.py [--sizes 10000 40000 70000] [--repeat 1] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import graphgen  # noqa: E402
import oracle  # noqa: E402

PASS_SHORT = {"assign_backward_streams": "assign", "assign_epilogue_copy_streams": "epilogue",
              "insert_backward_syncs": "syncs", "sync_deallocations": "dealloc",
              "wrap_all_sync_nodes_with_control_deps": "wrap"}


def make_graph(size: int, seed: int = 0):
    "A backward-like graph with about `size` compute nodes on 3 streams."
    return graphgen.random_backward_graph(seed, n_nodes=size, n_streams=3, n_primals=8, n_tangents=8,
                                          p_stay=0.9, p_user_sync=0.02, p_consume=0.5, fast=True)


def _best(fn, base, repeat):
    best = None
    for _ in range(repeat):
        gm = oracle.copy_gm(base)
        t = fn(gm)
        best = t if best is None else {k: min(v, best[k]) for k, v in t.items()}
    return best


def time_torch(gm) -> dict:
    mod = oracle.load_impl("seed")
    times = {}
    with oracle.torch_env(mod, oracle.Counter()):
        for p in oracle.PIPELINE:
            t0 = time.perf_counter()
            oracle.torch_pass(mod, p, "gpu")(gm)
            times[PASS_SHORT[p]] = time.perf_counter() - t0
    times["total"] = sum(times.values())
    return times


def time_streamnb_passes(gm) -> dict:
    "streamnb upstream=True, pass by pass, under one registry."
    from streamnb.graph import StreamRegistry
    times = {}
    reg, dev = StreamRegistry(start=oracle.START), oracle.device_spec()
    for p in oracle.PIPELINE:
        t0 = time.perf_counter()
        oracle.run_streamnb(gm, (p,), mode="gpu", registry=reg, device=dev)
        times[PASS_SHORT[p]] = time.perf_counter() - t0
    times["total"] = sum(times.values())
    return times


def time_pipeline(upstream: bool):
    def run(gm) -> dict:
        from streamnb.graph import StreamRegistry, use_registry
        from streamnb.pipeline import run_stream_passes
        with use_registry(StreamRegistry(start=oracle.START)):
            t0 = time.perf_counter()
            if upstream: run_stream_passes(gm, upstream=True, mechanism="sync_dealloc", device=oracle.device_spec())
            else: run_stream_passes(gm)
            return {"total": time.perf_counter() - t0}
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 40000, 70000])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--torch-max", type=int, default=20000,
                    help="skip PyTorch's passes above this size (its wrap pass grows superlinearly: ~25 s at 10k "
                         "and ~8 min at 40k nodes on a small shared machine)")
    ap.add_argument("--profile", action="store_true", help="cProfile streamnb's default pipeline at the largest size")
    a = ap.parse_args(argv)
    logging.getLogger("torch._inductor.utils").setLevel(logging.ERROR)

    cols = list(PASS_SHORT.values()) + ["total"]
    print(f"{'size':>7} {'nodes':>7} {'impl':<18}" + "".join(f"{c:>10}" for c in cols) + f"{'vs torch':>10}")
    totals = {}
    for size in a.sizes:
        t0 = time.perf_counter()
        base = make_graph(size)
        n = len(base.graph.nodes)
        gen = time.perf_counter() - t0
        rows = {"torch (seed)": _best(time_torch, base, a.repeat) if size <= a.torch_max else None,
                "streamnb upstream": _best(time_streamnb_passes, base, a.repeat),
                "  run_stream_passes": _best(time_pipeline(True), base, a.repeat),
                "streamnb default": _best(time_pipeline(False), base, a.repeat)}
        ref = rows["torch (seed)"]["total"] if rows["torch (seed)"] else None
        for name, t in rows.items():
            if t is None:
                print(f"{size:>7} {n:>7} {name:<18}  skipped (size > --torch-max {a.torch_max})"); continue
            cells = "".join(f"{t[c]:>10.3f}" if c in t else f"{'':>10}" for c in cols)
            ratio = f"{t['total'] / ref:>9.2f}x" if ref else ""
            print(f"{size:>7} {n:>7} {name:<18}{cells}{ratio}")
        print(f"{'':>7} (graph generated in {gen:.2f}s)")
        totals[size] = {k: v["total"] for k, v in rows.items() if v is not None}
    if len(a.sizes) > 1:
        s0, s1 = a.sizes[0], a.sizes[-1]
        print(f"\ngrowth {s0} -> {s1} nodes (x{s1 / s0:.1f}):  " +
              ", ".join(f"{k.strip()} x{totals[s1][k] / totals[s0][k]:.1f}" for k in totals[s0] if k in totals[s1]))
    if a.profile:
        base = make_graph(max(a.sizes))
        gm = oracle.copy_gm(base)
        prof = cProfile.Profile()
        prof.enable(); time_pipeline(False)(gm); prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
