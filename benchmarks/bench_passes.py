"""Time streamnb's stream passes against PyTorch's own on big backward-like graphs.

For each graph shape and size, one graph is built and copied for every run (the same graph for every
implementation), and on the copies we time, pass by pass in graph_capture.py's order:

* torch:      PyTorch 2.13's passes (the seed variant, run on the CPU with the oracle's stubs, "gpu" mode);
* upstream:   streamnb with upstream=True (same registry start, same device numbers as the stubs);
* default:    streamnb's corrected passes with their defaults (what `run_stream_passes(gm)` runs).

`run_stream_passes` is exactly these five calls, so a row's total is the pipeline's time.

Shapes (fast path: every compute node shares one meta `val`, so building the graph costs little):

* backward: layers of about 20 nodes (--layer), as a backward graph has them: an elementwise chain and the input gradient on
            stream 0, the weight and bias gradients of each layer on a side stream (1 or 2) that reads the chain
            (a record/wait pair and a sync_dealloc per layer), every 4th layer a side-stream branch that flows back
            into the chain, an unannotated node, a gradient accumulation; the output returns every gradient (one
            output per 10 nodes), as a real backward graph's does.
* stress:   tests/graphgen.py's random graphs (3 streams, fan-out, user syncs, p_consume=0.5): about one sync per
            compute node, few outputs.

Times are wall-clock seconds (best of --repeat); `us/node` is the total per node of the input graph: a pipeline
that is linear in the graph's size keeps it flat across sizes. Nothing is asserted. `--profile` runs cProfile on
streamnb's default pipeline at the largest size of the first shape.

    python benchmarks/bench_passes.py [--shapes backward stress] [--sizes 10000 40000 70000] [--repeat 1]
                                      [--layer 20] [--torch-max N] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import logging
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import graphgen  # noqa: E402
import oracle  # noqa: E402

aten = torch.ops.aten
PASS_SHORT = {"assign_backward_streams": "assign", "assign_epilogue_copy_streams": "epilogue",
              "insert_backward_syncs": "syncs", "sync_deallocations": "dealloc",
              "wrap_all_sync_nodes_with_control_deps": "wrap"}
LAYER = 20   # nodes per layer of the backward shape (--layer)


def backward_graph(size: int, layer: int = LAYER):
    "A backward graph of about `size` nodes in layers of about `layer` nodes (see the module docstring)."
    from streamnb.graph import GraphBuilder
    b = GraphBuilder()
    val = torch.empty((4, 4), device="meta")
    n_layers = max(1, size // layer)
    weights = [b.input(f"primals_{i + 1}", tag="is_forward") for i in range(n_layers)]
    saved = [b.input(f"saved_{i + 1}", tag="is_forward") for i in range(n_layers)]
    g = b.input("tangents_1")
    op = lambda target, *args, s=None, acc=False: b.op(target, *args, stream=s, val=val, acc=acc)
    grads = []
    for i in reversed(range(n_layers)):
        side = 1 + i % 2
        a = op(aten.mul.Tensor, g, saved[i], s=0)                    # elementwise backward on the main stream
        c = op(aten.neg.default, a, s=0)
        for _ in range(layer - 14): c = op(aten.add.Tensor, c, a, s=0)
        c = op(aten.sin.default, c, s=0)
        wg = op(aten.mm.default, c, saved[i], s=side)               # weight and bias gradients on a side stream
        wg = op(aten.mul.Tensor, wg, wg, s=side)
        bg = op(aten.relu.default, op(aten.neg.default, c, s=side), s=side)
        grads += [wg, bg]
        e = op(aten.add.Tensor, op(aten.mm.default, c, weights[i], s=0), g, s=0)   # input gradient + residual
        if i % 4 == 0:                                              # a side-stream branch back into the chain
            h = op(aten.relu.default, e, s=side)
            e = op(aten.add.Tensor, e, op(aten.mul.Tensor, h, h, s=side), s=0)
        else:                                                       # an unannotated node on the way
            e = op(aten.add.Tensor, op(aten.sin.default, op(aten.neg.default, e, s=0)), e, s=0)
        g = op(aten.relu.default, e, s=0)
    if len(grads) > 2: grads.append(op(aten.add.Tensor, grads[0], grads[2], acc=True))   # a tied weight
    return b.output(g, *grads)


def stress_graph(size: int, seed: int = 0):
    "tests/graphgen.py's random graph with about `size` compute nodes on 3 streams."
    return graphgen.random_backward_graph(seed, n_nodes=size, n_streams=3, n_primals=8, n_tangents=8,
                                          p_stay=0.9, p_user_sync=0.02, p_consume=0.5, fast=True)


SHAPES = {"backward": backward_graph, "stress": stress_graph}


def build(shape: str, size: int, layer: int = LAYER):
    return backward_graph(size, layer) if shape == "backward" else SHAPES[shape](size)


def _best(fn, base, repeat):
    best = None
    for _ in range(repeat):
        gm = oracle.copy_gm(base)
        gc.collect()
        t = fn(gm)
        best = t if best is None else {k: min(v, best[k]) for k, v in t.items()}
        del gm
    return best


def _timed(steps) -> dict:
    times = {}
    for name, step in steps:
        t0 = time.perf_counter()
        step()
        times[name] = time.perf_counter() - t0
    times["total"] = sum(times.values())
    return times


def time_torch(gm) -> dict:
    "PyTorch's passes (seed variant), pass by pass."
    mod = oracle.load_impl("seed")
    with oracle.torch_env(mod, oracle.Counter()):
        return _timed([(PASS_SHORT[p], lambda p=p: oracle.torch_pass(mod, p, "gpu")(gm)) for p in oracle.PIPELINE])


def time_streamnb(upstream: bool):
    "streamnb's passes in `run_stream_passes`'s order, pass by pass, under one registry."
    def run(gm) -> dict:
        from streamnb.assign import assign_backward_streams, assign_epilogue_copy_streams
        from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps
        from streamnb.dealloc import sync_deallocations
        from streamnb.graph import StreamRegistry, use_registry
        from streamnb.syncs import insert_backward_syncs
        # upstream: the oracle's device numbers and mechanism (as torch gets them); default: the pipeline's defaults
        dealloc_kw = dict(mechanism="sync_dealloc", device=oracle.device_spec()) if upstream else {}
        with use_registry(StreamRegistry(start=oracle.START)):
            return _timed([
                ("assign", lambda: assign_backward_streams(gm, upstream=upstream)),
                ("epilogue", lambda: assign_epilogue_copy_streams(gm, upstream=upstream)),
                ("syncs", lambda: insert_backward_syncs(gm, upstream=upstream)),
                ("dealloc", lambda: sync_deallocations(gm, upstream=upstream, **dealloc_kw)),
                ("wrap", lambda: wrap_all_sync_nodes_with_control_deps(gm, upstream=upstream))])
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["backward"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 40000, 70000])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--layer", type=int, default=LAYER,
                    help="nodes per layer of the backward shape (>= 15): more nodes per layer, fewer outputs and syncs")
    ap.add_argument("--torch-max", type=int, default=None,
                    help="skip PyTorch's passes above this size (its wrap pass grows quadratically with the number "
                         "of outputs)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile streamnb's default pipeline at the largest size of the first shape")
    a = ap.parse_args(argv)
    logging.getLogger("torch._inductor.utils").setLevel(logging.ERROR)

    cols = list(PASS_SHORT.values()) + ["total"]
    head = f"{'shape':<9}{'size':>7}{'nodes':>8} {'impl':<18}" + "".join(f"{c:>9}" for c in cols)
    print(head + f"{'us/node':>9}{'vs torch':>10}", flush=True)
    for shape in a.shapes:
        per_node: dict[str, dict[int, float]] = {}
        for size in a.sizes:
            t0 = time.perf_counter()
            base = build(shape, size, a.layer)
            n = len(base.graph.nodes)
            gen = time.perf_counter() - t0
            skip = a.torch_max is not None and size > a.torch_max
            rows = {"torch (seed)": None if skip else _best(time_torch, base, a.repeat),
                    "streamnb upstream": _best(time_streamnb(True), base, a.repeat),
                    "streamnb default": _best(time_streamnb(False), base, a.repeat)}
            ref = rows["torch (seed)"]["total"] if rows["torch (seed)"] else None
            for name, t in rows.items():
                lead = f"{shape:<9}{size:>7}{n:>8} {name:<18}"
                if t is None:
                    print(lead + f"  skipped (size > --torch-max {a.torch_max})"); continue
                us = t["total"] / n * 1e6
                per_node.setdefault(name, {})[size] = us
                ratio = f"{t['total'] / ref:>9.2f}x" if ref else ""
                print(lead + "".join(f"{t[c]:>9.2f}" for c in cols) + f"{us:>9.0f}{ratio:>10}", flush=True)
            print(f"{'':<9}{'':>7}{'':>8} (graph built in {gen:.1f} s)", flush=True)
            del base
        if len(a.sizes) > 1:
            s0, s1 = a.sizes[0], a.sizes[-1]
            print(f"{shape}: us/node at {s1} / at {s0} nodes (1.0 = linear): " +
                  ", ".join(f"{k} {v[s1] / v[s0]:.2f}" for k, v in per_node.items() if s0 in v and s1 in v) + "\n")
    if a.profile:
        gm = build(a.shapes[0], max(a.sizes), a.layer)
        prof = cProfile.Profile()
        prof.enable(); time_streamnb(False)(gm); prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
