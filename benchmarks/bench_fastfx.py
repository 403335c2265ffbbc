"""What each part of `streamnb.fastfx` buys on the AOTAutograd path (issue 21, item 1).

AOTAutograd calls each stream pass alone, on a `_LazyGraphModule`, with the garbage collector as its caller left
it (enabled). This script does the same: per shape and size (final node counts, built as in bench_passes.py), each
variant below runs the five passes one after the other on a fresh lazy copy, each pass timed alone, with GC on
(in CPU seconds of this process, `time.process_time`, so that other work on the shared machine is not counted).
Variants are run in turn (`--repeat` rounds, best kept), so a slow spell of the shared machine slows all alike.

* fast:            fastfx as it is;
* public:          `fastfx.FAST = False` (every function is FX's / Inductor's public call);
* -create_node:    fast `create_node` replaced by `graph.create_node` (everything else fast);
* -name cache:     the per-op name cache never keeps an entry (before issue 21 only: gone since);
* fx body:         `create_node` is `Graph.create_node`'s own body without its SymInt scan, FX's own naming (before
                   issue 21 only, whose create_node also split names without FX's regex);
* -candidates:     `create_node` keeps no per-target candidate name (FX's `_target_to_str` on every node);
* -lazy template:  the subgraph module is `_LazyGraphModule(root, graph)`;
* -subgraph:       `create_subgraph_for_node` and `subgraph_name` are Inductor's (their nodes and modules public);
* -attrs:          `has_attr`/`set_submodule` are `hasattr`/`setattr` (before issue 21: they are gone since);
* +paused_gc:      fast, and each pass additionally inside `fastfx.paused_gc()` (what pausing would buy).

Ratios are a variant's total over fast's total, per row (above 1: the part buys that much). To measure another
export of streamnb (e.g. a copy made before a change), point STREAMNB_SRC at the folder that holds `streamnb/`.

    python benchmarks/bench_fastfx.py [--shapes backward stress] [--sizes 20000 40000] [--repeat 2] [--variants fast ...]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_passes as B  # noqa: E402  (honours STREAMNB_SRC)

from torch.fx import Graph  # noqa: E402
from torch.fx._lazy_graph_module import _LazyGraphModule  # noqa: E402


class _NoKeep(dict):
    "A cache that keeps nothing."
    def __setitem__(self, k, v): pass


def variants(F) -> dict:
    "variant name -> a function returning a context manager that switches `F` (streamnb.fastfx) accordingly."
    from torch._inductor.fx_passes.control_dependencies import _create_subgraph_for_node, get_subgraph_name
    public_node = lambda graph, op, target, args=(), kwargs=None, name=None: Graph.create_node(graph, op, target, args, kwargs, name)
    def patch(**kw):
        return lambda: contextlib.ExitStack() if not kw else _patches(F, kw)
    v = {"fast": patch(), "public": patch(FAST=False), "-create_node": patch(create_node=public_node)}
    if hasattr(F, "_TARGET_NAMES"): v["-name cache"] = patch(_TARGET_NAMES=_NoKeep())   # (before issue 21 only)
    if hasattr(F, "_TARGET_NAMES"): v["fx body"] = patch(create_node=_fx_body)   # (before issue 21 only)
    if hasattr(F, "_CANDIDATES"): v["-candidates"] = patch(_CANDIDATES=_NoKeep())
    lazy = "lazy_graph_module" if hasattr(F, "lazy_graph_module") else "_lazy_module"   # (before and after)
    v["-lazy template"] = patch(**{lazy: _LazyGraphModule})
    v["-subgraph"] = patch(create_subgraph_for_node=_create_subgraph_for_node, subgraph_name=get_subgraph_name)
    if hasattr(F, "has_attr"): v["-attrs"] = patch(has_attr=hasattr, set_submodule=setattr)   # (before only)
    v["+paused_gc"] = patch()
    return v


def _fx_body(graph, op, target, args=(), kwargs=None, name=None):
    "torch 2.13's `Graph.create_node` minus the SymInt scan: FX's own naming, no cache."
    from torch.fx import Node
    from torch.fx.immutable_collections import immutable_dict
    name = graph._graph_namespace.create_name(name if name is not None else graph._target_to_str(target), None)
    n = Node(graph, name, op, target, args, kwargs or immutable_dict(), None)
    if graph.owning_module is not None and getattr(graph.owning_module, "_create_node_hooks", None) is not None:
        for f in graph.owning_module._create_node_hooks: f(n)
    graph._graph_namespace.associate_name_with_obj(name, n)
    graph._insert(n)
    graph._find_nodes_lookup_table.insert(n)
    graph._len += 1
    return n


def _patches(F, kw):
    st = contextlib.ExitStack()
    for k, val in kw.items(): st.enter_context(mock.patch.object(F, k, val))
    return st


def run_alone(gm, switch, pause: bool) -> dict:
    "The five passes, each called alone on `gm` as AOTAutograd calls them (GC as left: enabled); seconds per pass."
    import streamnb.pipeline as P
    from streamnb import fastfx as F
    from streamnb.graph import StreamRegistry, use_registry
    times = {}
    gc.collect()
    assert gc.isenabled()
    with use_registry(StreamRegistry(start=B.oracle.START)), switch():
        for name, short in B.PASS_SHORT.items():
            fn = getattr(P, name)
            t0 = time.process_time()
            with F.paused_gc() if pause else contextlib.nullcontext(): fn(gm)
            times[short] = time.process_time() - t0
    times["total"] = sum(times.values())
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["backward", "stress"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[20000, 40000])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--variants", nargs="+", help="only these (default: all the module has)")
    a = ap.parse_args()
    from streamnb import fastfx as F
    print(B.describe_code(), "\nfastfx:", F.__file__, "FAST =", F.FAST)
    cols = list(B.PASS_SHORT.values()) + ["total"]
    for shape in a.shapes:
        for size in a.sizes:
            base = B.build(shape, size)
            vs = {k: v for k, v in variants(F).items() if not a.variants or k in a.variants}
            best: dict = {}
            for _ in range(a.repeat):
                for name, switch in vs.items():
                    gm = B.copy_as(base, "lazy")
                    t = run_alone(gm, switch, pause=name == "+paused_gc")
                    out = len(gm.graph.nodes)
                    best[name] = t if name not in best else {k: min(v, best[name][k]) for k, v in t.items()}
                    del gm
            print(f"\n{shape} {size} ({len(base.graph.nodes)} in, {out} out)")
            print(f"{'variant':<16}" + "".join(f"{c:>9}" for c in cols) + f"{'vs fast':>9}")
            for name, t in best.items():
                print(f"{name:<16}" + "".join(f"{t[c]:>9.3f}" for c in cols) + f"{t['total'] / best['fast']['total']:>9.2f}")


if __name__ == "__main__":
    main()
