"""What the stream passes' output costs to build at all, against the time issue 23's targets leave (items 1-2).

For each shape (bench_passes.py's shapes and sizes), streamnb's five passes run once on a lazy copy, each called alone
(the AOTAutograd path), and the benchmark counts what they made: each new stream-op node of the main graph, and each
`control_deps` node with its sync's arguments, its deps and the values it passes through. Then it times three things:

* `objects`: building those FX objects again on a scratch graph, with no decision taken, by the fastest path the
  passes use (`streamnb.fastfx`): per new stream op one `call_function` node; per `control_deps` node the sync it
  replaces (unless the input graph had it), its subgraph module (`fastfx.create_subgraph_for_node`), the module
  attribute, the `get_attr`, `control_deps` and `getitem` nodes, and the sync's erasure. The collector is paused and
  the generation-0 collection that the caller's next allocation then runs is included, as in bench_passes' `aot`
  table. The rewiring of users to the getitems is left out, so this is a lower bound.
* `checks`: what the five public passes spend, in the same run, on the checks the quality bar asks of every public
  call (`validate`, the transaction's snapshot, `check_stream_ops`, `already_processed`): bad input gets a clear error
  and never leaves a half-rewritten graph.
* `public` (upstream rows): the same objects built the way torch 2.13 builds them (FX's public calls, Inductor's
  `_create_subgraph_for_node`, the collector on): the share of torch's own time that is object building.
* torch 2.13's five passes on the same graph, and streamnb's own total, in each table's condition (bench_passes'
  `timed_run`).

It prints, per table and row (bench_passes' `aot` table: upstream against torch/3, default against torch/2, item 1;
its `like` table, `gc.disable()` around both sides and no collection in `objects`: torch/2 and torch/1.5, item 2),
the time the target leaves and the floor (`objects + checks`) as a share of it. A floor above 100% means that no
implementation that builds the same output out of FX's objects (as fast as streamnb knows how) with the same checks
meets the target on that graph; near 100%, none is left for the passes' own walks and decisions. Nothing is asserted
on time.

    python benchmarks/bench_floor.py                       # shapes backward stress dag at 100000 final nodes
    python benchmarks/bench_floor.py --shapes stress --sizes 40000 100000
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import operator
import sys
import time
from unittest import mock
from pathlib import Path

import torch
from torch.fx import Graph, Node
from torch.fx._lazy_graph_module import _LazyGraphModule

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_passes as B  # noqa: E402  (also puts tests/ on the path and honours STREAMNB_SRC)

import streamnb.fastfx as F  # noqa: E402
import streamnb.graph as G  # noqa: E402
import streamnb.streamops as SO  # noqa: E402
from streamnb.graph import is_control_deps  # noqa: E402

CHECKS = (G.validate, G._Snapshot, G.already_processed, SO.check_stream_ops)   # what every public pass runs first
# bench_passes' table -> row -> target (times faster than torch 2.13): issue 23, item 1 (aot) and item 2 (like)
TARGETS = {"aot": {"streamnb upstream": 3.0, "streamnb default": 2.0},
           "like": {"streamnb upstream": 2.0, "streamnb default": 1.5}}


def run_counting_checks(row: str, gm) -> tuple[float, float, collections.Counter]:
    """Run `row`'s five passes alone on `gm` (collector on); (total s with the gen-0 collection after, s in CHECKS,
    calls per check). Each check is timed wherever a streamnb module binds it (the passes import some by name)."""
    spent, calls = [0.0], collections.Counter()
    def timed(f):
        def run(*a, **k):
            calls[f.__name__] += 1
            t0 = time.perf_counter()
            try: return f(*a, **k)
            finally: spent[0] += time.perf_counter() - t0
        return run
    with contextlib.ExitStack() as patches:
        for mod in [m for name, m in sys.modules.items() if name.split(".")[0] == "streamnb"]:
            for attr, value in list(vars(mod).items()):
                if any(value is f for f in CHECKS): patches.enter_context(mock.patch.object(mod, attr, timed(value)))
        gc.collect()
        t0 = time.perf_counter()
        B.ALONE[row](gm, {})
        gc.collect(0)   # what the passes made while they paused the collector (bench_passes.timed_run does the same)
        total = time.perf_counter() - t0
    return total, spent[0], calls


def what_was_made(gm, before: set[Node], input_names: set[str]) -> tuple[list, list]:
    """What the passes made in `gm` (`before`: its nodes before them; `input_names`: the input graph's node names):
    the new bare stream-op nodes as (target, args), and the control_deps nodes as (the sync's target, its args, number
    of deps, number of values passed through, whether the sync is new rather than the input's); a Node argument is
    written `("node", i)`, `i` its place among the sync's Node arguments (0 for a bare op)."""
    ops, wraps = [], []
    for n in gm.graph.nodes:
        if n in before or n.op != "call_function" or n.target is operator.getitem: continue
        if is_control_deps(n):
            sub = getattr(gm, n.args[1].target)
            call = next(m for m in sub.graph.nodes if m.op == "call_function")
            phs = [m for m in sub.graph.nodes if m.op == "placeholder"]
            args = tuple(("node", phs.index(a)) if isinstance(a, Node) else a for a in call.args)
            sync_name = n.args[1].target[len("subgraph_"):]   # (`subgraph_name` adds `_0` only on a clash)
            wraps.append((call.target, args, len(n.args[0]), len(n.args) - 2, sync_name not in input_names))
        elif n.target in SO.OPS:
            ops.append((n.target, tuple(("node", 0) if isinstance(a, Node) else a for a in n.args)))
    return ops, wraps


def build_objects(ops: list, wraps: list, public: bool = False) -> tuple[float, _LazyGraphModule]:
    """Seconds to build `what_was_made`'s objects on a scratch graph (collector paused, gen-0 collection included); it.
    `public`: through FX's public calls and Inductor's `_create_subgraph_for_node`, collector on, as torch 2.13 does."""
    from torch._inductor.fx_passes.control_dependencies import _create_subgraph_for_node
    from streamnb.control_deps import control_deps
    call = (lambda g, t, a: g.call_function(t, a)) if public else F.call_function
    get_attr = (lambda g, name: g.get_attr(name)) if public else (lambda g, name: F.create_node(g, "get_attr", name))
    subgraph = _create_subgraph_for_node if public else F.create_subgraph_for_node
    g = Graph()
    width = max([1, *(d + p for _, _, d, p, _ in wraps), *(len(args) for _, args, *_ in (*ops, *wraps))])
    pool = [g.placeholder(f"x{i}") for i in range(width)]   # the values the new nodes read (any graph's nodes would do)
    for p in pool: p.meta["val"] = torch.empty(4, device="meta")
    gm = _LazyGraphModule(torch.nn.Module(), g)
    node_args = lambda args: tuple(pool[a[1]] if isinstance(a, tuple) and a[:1] == ("node",) else a for a in args)
    bare = [None if new else call(g, t, node_args(args)) for t, args, _, _, new in wraps]   # the input's syncs
    gc.collect()
    t0 = time.perf_counter()
    with contextlib.nullcontext() if public else F.paused_gc():
        for target, args in ops: call(g, target, node_args(args))
        for (target, args, n_deps, n_pass, _), sync in zip(wraps, bare):
            sync = sync or call(g, target, node_args(args))
            deps, passed = pool[:n_deps], pool[n_deps:n_deps + n_pass]
            sub = subgraph(g, sync, passed)
            name = F.subgraph_name(gm, sync.name)
            setattr(gm, name, sub)
            with g.inserting_before(sync):
                get = get_attr(g, name)
                ctrl = call(g, control_deps, (tuple(deps), get, *passed))
            with g.inserting_after(ctrl):
                for i, p in enumerate(passed): call(g, operator.getitem, (ctrl, i + 1)).meta.update(p.meta)
            sync.replace_all_uses_with(ctrl)
            g.erase_node(sync)
    if gc.isenabled(): gc.collect(0)   # (inside gc.disable(), for the like-for-like table: no collection at all)
    return time.perf_counter() - t0, gm


def like_for_like(ops: list, wraps: list) -> float:
    "`build_objects` inside `gc.disable()`, the like-for-like table's condition."
    with F.paused_gc(): return build_objects(ops, wraps)[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(B.SHAPES), default=list(B.SHAPES))
    ap.add_argument("--sizes", type=int, nargs="+", default=[100000], help="final node counts, about (bench_passes')")
    a = ap.parse_args(argv)
    print(B.describe_code())
    print(f"\n{'table':<6}{'shape':<9}{'size':>7}{'out':>8} {'row':<18}{'torch':>7}{'target':>8}{'leaves':>8}"
          f"{'streamnb':>9}{'objects':>9}{'checks':>8}{'floor':>8}{'floor/leaves':>13}{'x floor':>8}{'public':>8}")
    for shape in a.shapes:
        for size in a.sizes:
            base = B.build(shape, size)
            run = lambda path, row: B.timed_run(B.measurement(path, row), B.copy_as(base, "lazy"), "lazy")[0]["total"]
            torch_total = {path: run(path, "torch 2.13") for path in TARGETS}
            input_names = {n.name for n in base.graph.nodes}
            for row in TARGETS["aot"]:
                gm = B.copy_as(base, "lazy")
                before = set(gm.graph.nodes)
                aot_total, checks, _ = run_counting_checks(row, gm)
                ops, wraps = what_was_made(gm, before, input_names)
                n_out = len(gm.graph.nodes)
                del gm, before
                total = {"aot": aot_total, "like": run("like", row)}
                objects = {"aot": min(build_objects(ops, wraps)[0] for _ in range(2)),
                           "like": min(like_for_like(ops, wraps) for _ in range(2))}
                public = build_objects(ops, wraps, public=True)[0] if row == "streamnb upstream" else None
                for path, targets in TARGETS.items():
                    leaves, floor = torch_total[path] / targets[row], objects[path] + checks
                    print(f"{path:<6}{shape:<9}{size:>7}{n_out:>8} {row:<18}{torch_total[path]:>7.2f}"
                          f"{targets[row]:>7.1f}x{leaves:>8.2f}{total[path]:>9.2f}{objects[path]:>9.2f}{checks:>8.2f}"
                          f"{floor:>8.2f}{floor / leaves:>12.0%}{total[path] / floor:>7.2f}x"
                          + (f"{public:>8.2f}" if public is not None and path == "aot" else ""), flush=True)
            del base
    print("\nseconds. table: bench_passes' aot (collector on: issue 23, item 1) or like (gc.disable() around both sides:"
          "\nitem 2); target: times faster than torch; leaves: torch / target; streamnb: its own total in that table;"
          "\nobjects: the output's FX objects built with no decision (a lower bound); checks: validate, snapshot,"
          "\ncheck_stream_ops and already_processed inside the five public calls (measured in the aot run); floor:"
          "\nobjects + checks; x floor: streamnb / floor. A floor near or above 100% of `leaves` leaves no time for the"
          "\npasses' own walks and decisions: an implementation that builds the same output out of FX objects with these"
          "\nchecks cannot meet the target on that graph. public (aot, upstream rows): the same objects through FX's public"
          "\ncalls and Inductor's _create_subgraph_for_node, collector on, as torch 2.13 builds them: that much of torch's"
          "\ntime.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
