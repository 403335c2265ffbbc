"""Time streamnb's stream passes against PyTorch 2.13's own pipeline, at about 100k final nodes.

One command gives everything issue 9 (item 5) asks for:

    python benchmarks/bench_passes.py                      # shapes backward stress dag, sizes 10000 40000 100000
    python benchmarks/bench_passes.py --sizes 100000       # one size only (no flatness line)
    python benchmarks/bench_passes.py --profile            # cProfile + GC/codegen shares (largest size, first shape)

Sizes are FINAL node counts: each shape's input size is chosen so that PyTorch's pipeline leaves about that many
nodes in the main graph (`in` and `out` columns print the real counts; `out` is each row's own result).

Shapes (every compute node shares one meta `val`, so building a graph costs seconds):

* backward: layers of about 20 nodes (--layer), as a backward graph has them: an elementwise chain on stream 0, the
            weight and bias gradients on a side stream, branches back into the chain, one output per 10 nodes.
* stress:   tests/graphgen.py's `random_backward_graph` (3 streams in runs, fan-out, user syncs, p_consume=0.5).
* dag:      tests/graphgen.py's `random_dag_graph`: a random DAG like the issue's hidden graph (40% of the ops on two
            side streams, 25% unannotated, no runs; about 16.7k ops for 100k final nodes).

Rows, each on a fresh copy of the same graph:

* torch 2.13:        the installed `torch._functorch._aot_autograd.streams` (unchanged), the five passes in
                     graph_capture.py's order, on the CPU with tests/oracle.py's stubs ("gpu" mode);
* streamnb upstream: `run_stream_passes(gm, upstream=True)` with the stubs' device numbers and registry start;
* streamnb default:  `run_stream_passes(gm)` (the corrected passes, their defaults).

Module kinds, printed as two tables:

* lazy:  the input is a `torch.fx._lazy_graph_module._LazyGraphModule`, as AOTAutograd hands it in; the time ends
         when the pipeline returns (the main graph's codegen stays deferred, on both sides);
* plain: the input is a plain `GraphModule`; after the pipeline `_LazyGraphModule.force_recompile(gm)` and `gm.code`
         are timed as `codegen` (a no-op when the wrap pass already recompiled), so deferred codegen is paid on
         both sides. The control_deps subgraph modules are lazy on both sides (torch makes them lazy) and stay so.

Per-pass columns time each pass where the pipeline calls it (streamnb: the names in `streamnb.pipeline` are wrapped
with a timer, so the real `run_stream_passes` runs, with whatever it does around the passes); `total` is the whole
call (+ codegen). `us/node` is total per final node (the row's `out`). `vs torch` is torch's total over the row's
total (above 1: faster than PyTorch). `gc` is `ok` when `gc.isenabled()` and `gc.get_threshold()` are the same
after the run as before. The benchmark itself runs with the garbage collector on (as a user's process does) and
collects before each run.

Checks and extra measurements:

* identity: on every graph built, streamnb `upstream=True`'s output (lazy kind) is compared in canonical form
  (tests/oracle.py `canonical`, names and subgraphs included) with PyTorch's seed variant (`oracle.load_impl("seed")`,
  run untimed on another copy); the torch 2.13 row's output is compared with the seed's too (they differ only on
  wait_stream, which these shapes do not have).
* flatness: with several --sizes, us/node at the largest size over us/node at the smallest, per row and kind.
* peak memory: a separate, untimed run per row at the largest size (lazy kind) under `tracemalloc` (Python's
  allocations: peak above the start of the run, in MiB). tracemalloc slows the run, hence its own run.
  --no-memory skips it.
* --profile: at the largest size of the first shape, for streamnb default and upstream (plain kind, so codegen is
  in): cProfile's top 25 by tottime and by cumtime, then plain timings: as is; with `gc.disable()` around the call;
  with streamnb's own GC pause removed (if `streamnb.pipeline.paused_gc` exists) to show what the collector would
  cost; and the time spent in `GraphModule.recompile` (the main graph's codegen). Also torch with and without GC.

Nothing is asserted on time. Run alone on the machine (2 shared cores); --repeat N runs the rows in turn N times
(torch, upstream, default, torch, ...) and keeps each row's best, so that a slow spell slows every row alike.
To measure a commit rather than the working tree, export it and point STREAMNB_SRC at the export (the first line
printed says which streamnb ran):

    git archive <rev> streamnb | tar -x -C /tmp/rev && STREAMNB_SRC=/tmp/rev python benchmarks/bench_passes.py

    python benchmarks/bench_passes.py [--shapes backward stress dag] [--sizes 10000 40000 100000] [--repeat 1]
                                      [--kinds lazy plain] [--layer 20] [--no-memory] [--no-check]
                                      [--profile [--profile-out DIR]]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import logging
import os
import pstats
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from unittest import mock

import torch
from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule

ROOT = Path(__file__).resolve().parent.parent


def use_streamnb_from(src: str) -> None:
    "Import the `streamnb` package from `src`/streamnb (e.g. an export of a commit) instead of the installed one."
    import importlib.util
    pkg = Path(src).resolve() / "streamnb"
    spec = importlib.util.spec_from_file_location("streamnb", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["streamnb"] = mod
    spec.loader.exec_module(mod)


if os.environ.get("STREAMNB_SRC"): use_streamnb_from(os.environ["STREAMNB_SRC"])
sys.path.insert(0, str(ROOT / "tests"))
import graphgen  # noqa: E402
import oracle  # noqa: E402

aten = torch.ops.aten
PASS_SHORT = {"assign_backward_streams": "assign", "assign_epilogue_copy_streams": "epilogue",
              "insert_backward_syncs": "syncs", "sync_deallocations": "dealloc",
              "wrap_all_sync_nodes_with_control_deps": "wrap"}
COLS = list(PASS_SHORT.values()) + ["codegen", "total"]
ROWS = ("torch 2.13", "streamnb upstream", "streamnb default")
KINDS = ("lazy", "plain")
LAYER = 20   # nodes per layer of the backward shape (--layer)

# ----------------------------------------------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------------------------------------------


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


def dag_graph(size: int, seed: int = 0):
    "tests/graphgen.py's random DAG with `size` ops (40% on side streams)."
    return graphgen.random_dag_graph(seed, n_ops=size)


# shape -> (builder, final nodes per unit of the builder's size with torch's pipeline, measured at 2k)
SHAPES = {"backward": (backward_graph, 2.12), "stress": (stress_graph, 4.8), "dag": (dag_graph, 6.0)}


def build(shape: str, final: int, layer: int = LAYER) -> GraphModule:
    "A graph of `shape` that PyTorch's pipeline turns into about `final` nodes."
    make, growth = SHAPES[shape]
    n = max(10, round(final / growth))
    return make(n, layer) if shape == "backward" else make(n)


def copy_as(base: GraphModule, kind: str) -> GraphModule:
    "A fresh copy of `base`: a `_LazyGraphModule` ('lazy') or a plain `GraphModule` ('plain', code generated)."
    return oracle.copy_gm(base, cls=_LazyGraphModule if kind == "lazy" else GraphModule)

# ----------------------------------------------------------------------------------------------------------------
# The three pipelines, timed pass by pass
# ----------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def timers(namespace, times: dict):
    "Wrap the pass functions named in `namespace` with a timer that adds into `times[short name]`."
    def timed(fn, short):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try: return fn(*args, **kwargs)
            finally: times[short] = times.get(short, 0.0) + time.perf_counter() - t0
        return run
    with contextlib.ExitStack() as st:
        for name, short in PASS_SHORT.items():
            if hasattr(namespace, name): st.enter_context(mock.patch.object(namespace, name, timed(getattr(namespace, name), short)))
        yield


def run_torch(gm: GraphModule, times: dict, impl: str = "torch") -> None:
    "PyTorch's passes (`impl`: 'torch' = the installed 2.13 module, 'seed'), in graph_capture.py's order."
    mod = oracle.load_impl(impl)
    with oracle.torch_env(mod, oracle.Counter()), oracle.availability("gpu"):
        for p in oracle.PIPELINE:
            t0 = time.perf_counter()
            getattr(mod, p)(gm)
            times[PASS_SHORT[p]] = time.perf_counter() - t0


def run_streamnb(upstream: bool):
    "streamnb's `run_stream_passes`, its passes timed where it calls them, under the oracle's registry start."
    def run(gm: GraphModule, times: dict) -> None:
        import streamnb.pipeline as P
        from streamnb.graph import StreamRegistry, use_registry
        kw = dict(upstream=True, mechanism="sync_dealloc", device=oracle.device_spec()) if upstream else {}
        with use_registry(StreamRegistry(start=oracle.START)), timers(P, times):
            P.run_stream_passes(gm, **kw)
    return run


PIPELINES = {"torch 2.13": run_torch, "streamnb upstream": run_streamnb(True), "streamnb default": run_streamnb(False)}


@contextlib.contextmanager
def gc_watch(stats: dict):
    "Count the garbage collector's collections (per generation) and their time (`stats['s']`) inside the block."
    t0 = [0.0]
    def cb(phase, info):
        if phase == "start": t0[0] = time.perf_counter(); return
        stats["s"] = stats.get("s", 0.0) + time.perf_counter() - t0[0]
        stats[f"gen{info['generation']}"] = stats.get(f"gen{info['generation']}", 0) + 1
    gc.callbacks.append(cb)
    try: yield stats
    finally: gc.callbacks.remove(cb)


def gc_state():
    return gc.isenabled(), gc.get_threshold()


def timed_run(row: str, gm: GraphModule, kind: str, gc_stats: dict | None = None) -> tuple[dict, bool]:
    """Run `row`'s pipeline on `gm` (and, for 'plain', the deferred codegen); (times, global GC state unchanged).
    With `gc_stats`, the collections inside the timed part are counted into it (see `gc_watch`)."""
    times: dict = {}
    gc.collect()
    before = gc_state()
    with gc_watch(gc_stats) if gc_stats is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        PIPELINES[row](gm, times)
        t1 = time.perf_counter()
        if kind == "plain":
            _LazyGraphModule.force_recompile(gm)   # a no-op unless the module is lazy and not yet compiled
            gm.code
        t2 = time.perf_counter()
    times.update(codegen=t2 - t1, total=t2 - t0)
    return times, gc_state() == before


def best_runs(base: GraphModule, kind: str, repeat: int, keep: set) -> dict:
    """Each row run `repeat` times on fresh copies, the rows in turn (torch, upstream, default, torch, ...), so that a
    slow spell of the shared machine slows every row rather than one: row -> (best times, gc ok, final node count,
    the last output if the row is in `keep`)."""
    res = {row: (None, True, 0, None) for row in ROWS}
    for i in range(repeat):
        last = i == repeat - 1   # outputs are kept from the last round only: no kept graph slows torch's collector
        for row in ROWS:
            best, ok, _, _ = res[row]
            gm = copy_as(base, kind)
            t, same = timed_run(row, gm, kind)
            best = t if best is None else {k: min(v, best.get(k, v)) for k, v in t.items()}
            res[row] = (best, ok and same, len(gm.graph.nodes), gm if last and row in keep else None)
            del gm
    return res


def peak_memory(row: str, base: GraphModule) -> float:
    "Peak Python memory (MiB) of one untimed run of `row` on a lazy copy, above the start of the run."
    gm = copy_as(base, "lazy")
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    PIPELINES[row](gm, {})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - start) / 2**20


def identity(base: GraphModule, outs: dict) -> str:
    "Compare the lazy-kind outputs of streamnb upstream and torch 2.13 with the seed's, in canonical form."
    seed = copy_as(base, "lazy")
    run_torch(seed, {}, impl="seed")
    ref = oracle.canonical(seed)
    del seed
    words = []
    for row, label in (("streamnb upstream", "upstream == seed"), ("torch 2.13", "torch 2.13 == seed")):
        if outs.get(row) is None: continue
        diff = oracle.mismatch(ref, outs[row], ("seed", row))
        words.append(f"{label}: " + ("IDENTICAL" if diff is None else "DIFFERENT\n" + "\n".join(diff.splitlines()[:30])))
    return "; ".join(words)

# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def fmt_row(r: dict) -> str:
    t, ref = r["times"], r["ref"]
    ratio = f"{ref / t['total']:>8.2f}x" if ref else f"{'':>9}"
    return (f"{r['shape']:<9}{r['size']:>7}{r['in']:>8}{r['out']:>8} {r['row']:<18}"
            + "".join(f"{t.get(c, float('nan')):>9.2f}" for c in COLS)
            + f"{t['total'] / r['out'] * 1e6:>9.1f}{ratio}{'ok' if r['gc_ok'] else 'CHANGED':>8}")


HEAD = (f"{'shape':<9}{'size':>7}{'in':>8}{'out':>8} {'impl':<18}" + "".join(f"{c:>9}" for c in COLS)
        + f"{'us/node':>9}{'vs torch':>9}{'gc':>8}")


def describe_code() -> str:
    import streamnb
    src = Path(streamnb.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "streamnb"], cwd=src, capture_output=True,
                               text=True).stdout.strip()
        rev = (rev or "not a git checkout") + (" (streamnb/ has uncommitted changes)" if dirty else "")
    except OSError:
        rev = "?"
    return f"streamnb from {src} at {rev}; torch {torch.__version__}; Python {sys.version.split()[0]}"


def profile(shape: str, size: int, layer: int, out_dir: str | None = None) -> None:
    """cProfile streamnb's default and upstream pipelines (plain kind; stats files into `out_dir` if given, for
    `pstats` and its callers view), then the GC's and the codegen's shares."""
    base = build(shape, size, layer)
    print(f"\n## profile: {shape}, {len(base.graph.nodes)} input nodes (plain GraphModule, codegen included)")
    for row in ("streamnb default", "streamnb upstream"):
        gm = copy_as(base, "plain")
        gc.collect()
        prof = cProfile.Profile()
        prof.enable()
        PIPELINES[row](gm, {})
        gm.code
        prof.disable()
        if out_dir:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            prof.dump_stats(Path(out_dir) / f"{shape}_{size}_{row.split()[-1]}.prof")
        for key in ("tottime", "cumulative"):
            print(f"\n### {row}: top 25 by {key} ({len(gm.graph.nodes)} final nodes)")
            pstats.Stats(prof, stream=sys.stdout).sort_stats(key).print_stats(25)
        del gm, prof
    print("\n## shares (plain kind, one run each, seconds)")
    for row in ROWS:
        res, seen = {}, {}
        res["as is"] = timed_run(row, copy_as(base, "plain"), "plain", seen)[0]["total"]
        res["of which in collections"] = seen.get("s", 0.0)
        gm = copy_as(base, "plain")
        gc.collect(); gc.disable()
        try: res["gc.disable() around"] = timed_run(row, gm, "plain")[0]["total"]
        finally: gc.enable()
        del gm
        if row != "torch 2.13":
            import streamnb.pipeline as P
            if hasattr(P, "paused_gc"):
                with mock.patch.object(P, "paused_gc", contextlib.nullcontext):
                    res["streamnb's GC pause removed"] = timed_run(row, copy_as(base, "plain"), "plain")[0]["total"]
        spent = [0.0]
        real = GraphModule.recompile
        def recompile(self, *a, **k):
            t0 = time.perf_counter()
            try: return real(self, *a, **k)
            finally: spent[0] += time.perf_counter() - t0
        with mock.patch.object(GraphModule, "recompile", recompile):
            t = timed_run(row, copy_as(base, "plain"), "plain")[0]["total"]
        res["GraphModule.recompile (codegen) in that run"] = spent[0]
        res["its total"] = t
        print(f"{row}: " + ", ".join(f"{k} {v:.2f}" for k, v in res.items())
              + f"  (codegen {spent[0] / t:.0%} of total; collections as is: "
              + ", ".join(f"{k} x{v}" for k, v in sorted(seen.items()) if k != "s") + ")")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 40000, 100000],
                    help="final node counts (after PyTorch's pipeline), about")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--layer", type=int, default=LAYER, help="nodes per layer of the backward shape (>= 15)")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    ap.add_argument("--no-check", action="store_true", help="skip the identity check against the seed")
    ap.add_argument("--profile", action="store_true",
                    help="only profile streamnb (and the GC/codegen shares) at the largest size of the first shape")
    ap.add_argument("--profile-out", metavar="DIR", help="with --profile: also write the cProfile stats files here")
    a = ap.parse_args(argv)
    logging.getLogger("torch._inductor.utils").setLevel(logging.ERROR)
    print(describe_code(), flush=True)
    if a.profile:
        profile(a.shapes[0], max(a.sizes), a.layer, a.profile_out)
        return 0

    results, checks, memory = [], [], []
    print("\n" + HEAD, flush=True)
    for shape in a.shapes:
        for size in a.sizes:
            t0 = time.perf_counter()
            base = build(shape, size, a.layer)
            n_in = len(base.graph.nodes)
            print(f"# {shape} {size}: {n_in} input nodes, built in {time.perf_counter() - t0:.1f} s", flush=True)
            outs = {}
            for kind in a.kinds:
                ref = None
                check = {row for row in ROWS if kind == a.kinds[0] and not a.no_check and row != "streamnb default"}
                runs = best_runs(base, kind, a.repeat, check)
                for row in ROWS:
                    keep = row in check
                    times, ok, n_out, out = runs.pop(row)
                    if keep: outs[row] = oracle.canonical(out)
                    if row == "torch 2.13": ref = times["total"]
                    r = dict(shape=shape, size=size, kind=kind, row=row, times=times, gc_ok=ok, **{"in": n_in},
                             out=n_out, ref=ref if row != "torch 2.13" else None)
                    del out
                    results.append(r)
                    print(f"{kind:<6}" + fmt_row(r), flush=True)
            if not a.no_check:
                checks.append(f"{shape} {size} ({n_in} in): " + identity(base, outs))
                print("  " + checks[-1], flush=True)
            del outs
            if not a.no_memory and size == max(a.sizes):
                for row in ROWS:
                    memory.append(f"{shape:<9}{size:>7} {row:<18} {peak_memory(row, base):>9.0f} MiB")
                    print("  peak " + memory[-1], flush=True)
            del base

    for kind in a.kinds:
        title = {"lazy": "lazy module in (as AOTAutograd), codegen deferred on both sides",
                 "plain": "plain GraphModule in, codegen counted on both sides"}[kind]
        print(f"\n## {kind}: {title} (seconds; vs torch = torch's total / this total)\n" + HEAD)
        for r in results:
            if r["kind"] == kind: print(fmt_row(r))
        if len(a.sizes) > 1:
            s0, s1 = min(a.sizes), max(a.sizes)
            per = {(r["shape"], r["row"], r["size"]): r["times"]["total"] / r["out"] for r in results if r["kind"] == kind}
            for shape in a.shapes:
                print(f"flatness {shape}: us/node at {s1} / at {s0}: " + ", ".join(
                    f"{row} {per[shape, row, s1] / per[shape, row, s0]:.2f}" for row in ROWS))
    if checks: print("\n## identity (canonical form, upstream=True vs PyTorch's seed)\n" + "\n".join(checks))
    if memory: print("\n## peak Python memory (tracemalloc, separate run, lazy kind)\n" + "\n".join(memory))
    print("\n" + describe_code())
    return 0


if __name__ == "__main__":
    sys.exit(main())
