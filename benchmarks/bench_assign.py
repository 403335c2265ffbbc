"""Stream assignment (issue 13): the table of chapter 21b and the time to assign a 20,000-node graph.

    python benchmarks/bench_assign.py [--nodes 20000] [--kernels 1300] [--side-streams 2] [--device H100] [--skip-table]
                                      [--skip-growth]

Prints, for the transformer block, the two-branch MLP, the mixture of small experts and the deep narrow chain, each of
the four strategies: streams used, cross-stream edges, syncs before/after minimisation, estimated makespan with free
overlap and with contention (µs), peak memory, the lower bound max(critical path, total work / device), and whether
the sanitizer finds the result race-free and reorder-safe. Then the scale runs (issue 24 item 3: streamnb's strategy
at most 1 s on a 1,300-kernel graph, at most 3 s on a 20k-node graph; its time over Nimble's printed): a backward-like
graph of about --kernels, then --nodes nodes (chapter 09's `backward_like`, its syncs removed) assigned by each strategy, then by streamnb as a
forward graph (tags removed) and run through the passes, with Nimble's steps timed at several sizes to show how the
matching baseline grows. Every number is an estimate of the cost and contention
models, not a measurement on a GPU.
"""
from __future__ import annotations

import argparse
import copy
import time
import tracemalloc
import warnings

from streamnb.choosing import STRATEGIES, assign_streams, format_table, judge, table_graphs, without_syncs
from streamnb.strategies import (NIMBLE_MAX, compute_dag, max_matching, min_chain_cover, reachability,
                                 transitive_reduction)
from streamnb.examples import backward_like
from streamnb.minsync import run_passes_fewest_syncs
from streamnb.graph import StreamRegistry, use_registry


def graph_of(nodes: int):
    "A sync-free backward-like graph with at least `nodes` nodes (backward_like's graphs are half syncs)."
    return without_syncs(backward_like(2 * nodes))


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def scale(nodes: int, side_streams: int, device: str) -> None:
    gm, t_build = timed(lambda: graph_of(nodes))
    n = sum(1 for _ in gm.graph.nodes)
    dag, t_dag = timed(lambda: compute_dag(gm, device=device, keep_user=False))
    print(f"\nscale: {n} nodes ({len(dag.nodes)} to assign, {dag.edges} edges), built in {t_build:.1f} s, "
          f"DAG in {t_dag:.2f} s; {side_streams} side streams, device {device}")
    times = {}
    for s in STRATEGIES:
        g = copy.deepcopy(gm)
        with use_registry(StreamRegistry(start=10 * n, current_stream=0)):
            _, t = timed(lambda: assign_streams(g, strategy=s, side_streams=side_streams, device=device, keep_user=False))
        info = g.meta["streamnb_assignment"]
        extra = ""
        if s == "streamnb":
            extra = "; judged: " + ", ".join(f"{name} {ms * 1e3:.0f} µs" for name, ms, _ in info["tried"])
        times[s] = t
        print(f"  {s:<14} {t:6.2f} s  streams {info['streams']}{extra}")
    print(f"  streamnb's time / Nimble's: {times['streamnb'] / times['nimble']:.2f}")
    print(f"  (streamnb asks Nimble only up to NIMBLE_MAX = {NIMBLE_MAX} nodes)")
    fw = copy.deepcopy(gm)   # the same graph as a forward / inference graph: no partitioner_tag, every node assigned
    for node in fw.graph.nodes: node.meta.pop("partitioner_tag", None)
    with use_registry(StreamRegistry(start=10 * n, current_stream=0)):
        _, t = timed(lambda: assign_streams(fw, side_streams=side_streams, device=device, keep_user=False))
        _, t_passes = timed(lambda: run_passes_fewest_syncs(fw, device=device))
    print(f"  as a forward graph: streamnb {t:.2f} s, streams {fw.meta['streamnb_assignment']['streams']}; "
          f"the passes with the fewest syncs {t_passes:.2f} s (syncs {fw.meta['streamnb_syncs']})")


def nimble_growth(sizes, device: str) -> None:
    print("\nNimble's steps by size (the matching baseline):")
    print(f"  {'nodes':>7} {'reach s':>8} {'MEG s':>7} {'match s':>8} {'cover s':>8} {'bitsets MiB':>12}")
    for size in sizes:
        dag = compute_dag(graph_of(size), device=device, keep_user=False)
        tracemalloc.start()
        reach, t_reach = timed(lambda: reachability(dag))
        mib = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        meg, t_meg = timed(lambda: transitive_reduction(dag, reach))
        _, t_match = timed(lambda: max_matching(meg, len(dag.nodes)))
        _, t_cover = timed(lambda: min_chain_cover(dag, reach))
        print(f"  {len(dag.nodes):>7} {t_reach:8.2f} {t_meg:7.2f} {t_match:8.2f} {t_cover:8.2f} {mib:12.1f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=20_000)
    p.add_argument("--side-streams", type=int, default=2)
    p.add_argument("--device", default="H100")
    p.add_argument("--skip-table", action="store_true")
    p.add_argument("--kernels", type=int, nargs="*", default=[1300],
                   help="smaller graphs timed first (1,300 kernels: the size of the largest IOS model, NASNet)")
    p.add_argument("--skip-growth", action="store_true", help="skip the timing of Nimble's steps by size")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if not a.skip_table:
        (rows, _), t = timed(lambda: judge(table_graphs(), side_streams=a.side_streams, device=a.device))
        print(f"stream assignment, {a.side_streams} side streams, {a.device} (estimates, not measurements; {t:.1f} s)\n")
        print(format_table(rows))
    for n in (*a.kernels, a.nodes): scale(n, a.side_streams, a.device)
    if not a.skip_growth: nimble_growth([a.nodes // 4, a.nodes // 2, a.nodes], a.device)


if __name__ == "__main__":
    main()
