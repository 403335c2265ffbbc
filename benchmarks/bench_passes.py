"""Time streamnb's stream passes against PyTorch 2.13's own pipeline, at about 100k final nodes.

One command gives everything issue 9 (item 5), issue 23 (items 1-2) and issue 50 (items 1, 4) ask for:

    python benchmarks/bench_passes.py                      # shapes backward stress dag, sizes 10000 100000
    python benchmarks/bench_passes.py --paths like --repeat 5 --sizes 10000 100000   # the headline only
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

Tables (--paths like aot heap pipeline; default like aot heap), each with the rows torch 2.13, streamnb upstream and
streamnb default, each row on a fresh copy of the same graph:

* like (like for like, THE HEADLINE, issue 50 item 1): the five passes each called alone, in graph_capture.py's
  order, with `gc.disable()` around both sides. streamnb: the functions in `streamnb.pipeline.STREAM_PASSES` (each a
  `stream_pass`), no pipeline around them; torch: the installed `torch._functorch._aot_autograd.streams`
  (unchanged), on the CPU with tests/oracle.py's stubs ("gpu" mode), as `run_torch` does.
* aot (AOTAutograd path, the path users take): the same calls with the collector ENABLED on both sides, the
  benchmark's own heap (streamnb's passes pause the collector inside their own calls; torch's do not). Its ratio
  moves with the caller's heap (how often a full collection comes), so it is not the headline.
* heap: as aot, the caller holding --heap (4,000,000) long-lived objects (empty lists, in the oldest generation), as
  a compile holds its own; these runs come after the others, in turn too, inside one `caller_heap`.
* pipeline: `run_stream_passes(gm[, upstream=True])` (collector paused for the whole pipeline) against torch's five
  passes with the collector on. torch's passes are always called alone, so the torch row of `aot` and `pipeline`
  is one measurement, printed in both tables.

Each measurement runs --repeat (5) times, in turn (torch, upstream, default, torch, ...), on fresh copies; each
column prints the median (--stat best: the best), `spread` the smallest and largest total, `collections` the median
number of the collector's collections per generation inside the timed part (gen0/gen1/gen2). The clock is CPU time
(`time.process_time`, --clock cpu) unless --clock wall.

streamnb upstream runs with `upstream=True`, the stubs' device numbers and registry start; streamnb default with the
corrected passes' defaults. Each distinct measurement runs in turn on the same graph (torch, upstream alone, default
alone, upstream pipeline, ..., torch gc off, ...).

Module kinds (--kinds, default lazy):

* lazy:  the input is a `torch.fx._lazy_graph_module._LazyGraphModule`, as AOTAutograd hands it in; the time ends
         when the last pass returns (the main graph's codegen stays deferred, on both sides);
* plain: the input is a plain `GraphModule`; after the passes `_LazyGraphModule.force_recompile(gm)` and `gm.code`
         are timed as `codegen` (a no-op when the wrap pass already recompiled), so deferred codegen is paid on
         both sides. The control_deps subgraph modules are lazy on both sides (torch makes them lazy) and stay so.

Per-pass columns time each pass call (pipeline rows: the passes are wrapped with a timer in
`streamnb.pipeline.STREAM_PASSES`, so the real `run_stream_passes` runs, with whatever it does around the passes);
`total` is the whole call (+ codegen). `us/node` is total per final node (the row's `out`). `vs torch` is torch's
total (same table) over the row's total (above 1: faster than PyTorch). `gc` is `ok` when `gc.isenabled()` and
`gc.get_threshold()` are the same after the run as before (inside the `gc.disable()` for `like`). The benchmark
collects before each run.

Checks and extra measurements:

* identity: on every graph built, streamnb `upstream=True`'s outputs (alone and pipeline, first kind) are compared
  in canonical form (tests/oracle.py `canonical`, names and subgraphs included) with PyTorch's seed variant
  (`oracle.load_impl("seed")`, run untimed on another copy after the timed runs); the torch 2.13 row's output is
  compared with the seed's too (they differ only on wait_stream, which these shapes do not have). The outputs are
  kept as pickled canonical forms, so no kept graph gives a later row's collector more to scan.
* flatness: with several --sizes, us/node at the largest size over us/node at the smallest, per row and kind.
* peak memory: a separate, untimed run per collector-on measurement at the largest size (lazy kind) under
  `tracemalloc` (Python's allocations: peak above the start of the run, in MiB). tracemalloc slows the run, hence its own run.
  --no-memory skips it.
* --profile: at the largest size of the first shape, for streamnb default and upstream (plain kind, so codegen is
  in): cProfile's top 25 by tottime and by cumtime, then plain timings: as is; with `gc.disable()` around the call;
  with streamnb's own GC pauses removed (the pipeline's and each stream_pass's `fastfx.paused_gc`) to show what the collector would
  cost; and the time spent in `GraphModule.recompile` (the main graph's codegen). Also torch with and without GC.

* targets: the like table's ratios at the largest size against issue 50's targets, and its flatness.
* syncs: per shape, `count_syncs` of each row's output; per real pattern (`streamnb.patterns`, both styles), the
  joint graph's syncs after the seed's passes and the default's (--no-syncs skips the patterns).

Nothing is asserted on time. Run alone on the machine (2 shared cores) if you can; the runs in turn make a slow spell
slow every row alike.
To measure a commit rather than the working tree, export it and point STREAMNB_SRC at the export (the first line
printed says which streamnb ran):

    git archive <rev> streamnb | tar -x -C /tmp/rev && STREAMNB_SRC=/tmp/rev python benchmarks/bench_passes.py

    python benchmarks/bench_passes.py [--shapes backward stress dag] [--sizes 10000 100000] [--repeat 5]
                                      [--paths like aot heap pipeline] [--kinds lazy [plain]] [--layer 20] [--no-memory]
                                      [--no-check] [--clock cpu|wall] [--stat median|best] [--heap 4000000] [--no-syncs]
                                      [--profile [--profile-out DIR]]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import logging
import os
import pickle
import pstats
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings
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
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]   # what the measurements read (--clock)

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
            t0 = clock()
            try: return fn(*args, **kwargs)
            finally: times[short] = times.get(short, 0.0) + clock() - t0
        return run
    with contextlib.ExitStack() as st:
        for name, short in PASS_SHORT.items():
            if hasattr(namespace, name): st.enter_context(mock.patch.object(namespace, name, timed(getattr(namespace, name), short)))
        table = getattr(namespace, "STREAM_PASSES", None)   # run_pass looks the passes up in this dict
        if table is not None:
            st.enter_context(mock.patch.dict(table, {n: timed(f, PASS_SHORT[n]) for n, f in table.items() if n in PASS_SHORT}))
        yield


def run_torch(gm: GraphModule, times: dict, impl: str = "torch") -> None:
    "PyTorch's passes (`impl`: 'torch' = the installed 2.13 module, 'seed'), in graph_capture.py's order."
    mod = oracle.load_impl(impl)
    with oracle.torch_env(mod, oracle.Counter()), oracle.availability("gpu"):
        for p in oracle.PIPELINE:
            t0 = clock()
            getattr(mod, p)(gm)
            times[PASS_SHORT[p]] = clock() - t0


def run_streamnb(upstream: bool):
    "streamnb's `run_stream_passes`, its passes timed where it calls them, under the oracle's registry start."
    def run(gm: GraphModule, times: dict) -> None:
        import streamnb.pipeline as P
        from streamnb.graph import StreamRegistry, use_registry
        kw = dict(upstream=True, mechanism="sync_dealloc", device=oracle.device_spec()) if upstream else {}
        with use_registry(StreamRegistry(start=oracle.START)), timers(P, times):
            P.run_stream_passes(gm, **kw)
    return run


def streamnb_kw(upstream: bool) -> dict:
    "The dealloc pass's machine options: the oracle's stub numbers for upstream=True, the defaults otherwise."
    return dict(mechanism="sync_dealloc", device=oracle.device_spec()) if upstream else {}


def run_alone(upstream: bool):
    """streamnb's five passes each called alone, as graph_capture.py calls them (the functions in
    `streamnb.pipeline.STREAM_PASSES`, in `PIPELINE_ORDER`), under the oracle's registry start; no pipeline around
    them, so the collector is as the caller left it (whatever each pass does with it inside its own call)."""
    def run(gm: GraphModule, times: dict) -> None:
        import streamnb.pipeline as P
        from streamnb.graph import PIPELINE_ORDER, StreamRegistry, use_registry
        with use_registry(StreamRegistry(start=oracle.START)):
            for name in PIPELINE_ORDER:
                fn = P.STREAM_PASSES[name]
                kw = streamnb_kw(upstream) if name == "sync_deallocations" else {}
                t0 = clock()
                fn(gm, upstream=upstream, **kw)
                times[PASS_SHORT[name]] = clock() - t0
    return run


PIPELINES = {"torch 2.13": run_torch, "streamnb upstream": run_streamnb(True), "streamnb default": run_streamnb(False)}
ALONE = {"torch 2.13": run_torch, "streamnb upstream": run_alone(True), "streamnb default": run_alone(False)}

HEAP = 4_000_000   # long-lived objects the `heap` table's caller holds (--heap): a compile holds millions

# path -> (title, how streamnb is called, collector off around both sides)
PATHS = {"like": ("like for like (THE HEADLINE): each pass called alone, gc.disable() around both sides", ALONE, True),
         "aot": ("AOTAutograd path: each pass called alone, collector ON on both sides, the benchmark's own heap",
                 ALONE, False),
         "heap": ("AOTAutograd path with a caller heap: as aot, the caller holding --heap long-lived objects", ALONE, False),
         "pipeline": ("pipeline: run_stream_passes (pauses the collector) vs torch's five passes, collector ON",
                      PIPELINES, False)}


def measurement(path: str, row: str) -> tuple[str, str, bool, bool]:
    """The measurement behind `row` of `path`'s table: (row, 'alone' or 'pipeline', collector off, caller heap held).
    torch's passes are always called alone, so its collector-on run serves both the AOTAutograd and the pipeline tables."""
    _, fns, off = PATHS[path]
    how = "pipeline" if fns is PIPELINES and row != "torch 2.13" else "alone"
    return row, how, off, path == "heap"


def runner(key: tuple[str, str, bool]):
    row, how = key[:2]
    return (PIPELINES if how == "pipeline" else ALONE)[row]


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


def timed_run(row, gm: GraphModule, kind: str, gc_stats: dict | None = None) -> tuple[dict, bool]:
    """Run `row`'s passes on `gm` (and, for 'plain', the deferred codegen); (times, global GC state unchanged).
    `row`: a ROWS name (the pipeline rows) or a `measurement` key (its collector off: `gc.disable()` around the run).
    With `gc_stats`, the collections inside the timed part are counted into it (see `gc_watch`)."""
    fn, off = (PIPELINES[row], False) if isinstance(row, str) else (runner(row), row[2])   # (a heap is the caller's)
    times: dict = {}
    gc.collect()
    if off: gc.disable()
    try:
        before = gc_state()
        with gc_watch(gc_stats) if gc_stats is not None else contextlib.nullcontext():
            t0 = clock()
            fn(gm, times)
            # What a pass made during its pause is young: the caller's next allocation scans it (a generation-0
            # collection). Run that collection here, on both sides, so that its cost is in the total.
            if not off and gc.isenabled(): gc.collect(0)
            t1 = clock()
            if kind == "plain":
                _LazyGraphModule.force_recompile(gm)   # a no-op unless the module is lazy and not yet compiled
                gm.code
            t2 = clock()
        after = gc_state()
    finally:
        if off: gc.enable()
    times.update(codegen=t2 - t1, total=t2 - t0)
    return times, after == before


@contextlib.contextmanager
def caller_heap(n: int):
    """`n` long-lived objects held by the caller while the block runs (empty lists: tracked by the collector, in its
    oldest generation after one full collection), as a compile holds its own; freed after the block."""
    heap = [[] for _ in range(n)]
    gc.collect()
    try: yield heap
    finally:
        del heap
        gc.collect()


def best_runs(base: GraphModule, kind: str, repeat: int, keys: list, keep: set, stat: str = "median",
              heap: int = HEAP) -> dict:
    """Each measurement (see `measurement`) run `repeat` times on fresh copies, in turn (torch, upstream, default,
    ..., torch, ...), so that a slow spell of the shared machine slows every row rather than one; the measurements with
    a caller heap run after the others, in turn too, inside one `caller_heap`. key -> (times: each column's median
    (`stat`, or its best), gc ok, final node count, the output's canonical form pickled if the key is in `keep`, every
    run's total, every run's collections {'gen0': count, ...}, the output's `count_syncs`). The canonical form is kept
    as one bytes object, so no kept graph gives the collector of a later row more to scan."""
    from streamnb.streamops import count_syncs
    runs = {k: [] for k in keys}
    res = {}
    def one(k, last):
        gm = copy_as(base, kind)
        seen: dict = {}
        t, same = timed_run(k, gm, kind, seen)
        out = pickle.dumps(oracle.canonical(gm)) if last and k in keep else None
        syncs = count_syncs(gm) if last else None
        runs[k].append((t, same, len(gm.graph.nodes), out, seen, syncs))
        del gm
    for group in ([k for k in keys if not k[3]], [k for k in keys if k[3]]):
        if not group: continue
        with caller_heap(heap) if group[0][3] else contextlib.nullcontext():
            for i in range(repeat):
                for k in group: one(k, i == repeat - 1)
    for k, rs in runs.items():
        pick = statistics.median if stat == "median" else min
        times = {c: pick([r[0].get(c, 0.0) for r in rs]) for c in rs[0][0]}
        res[k] = (times, all(r[1] for r in rs), rs[-1][2], rs[-1][3], [r[0]["total"] for r in rs],
                  [{g: v for g, v in r[4].items() if g != "s"} for r in rs], rs[-1][5])
    return res


def peak_memory(row, base: GraphModule) -> float:
    "Peak Python memory (MiB) of one untimed run of `row` (a ROWS name or a `measurement` key) on a lazy copy."
    fn = PIPELINES[row] if isinstance(row, str) else runner(row)
    gm = copy_as(base, "lazy")
    gc.collect()
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    fn(gm, {})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - start) / 2**20


def identity(base: GraphModule, outs: dict) -> str:
    "Compare the kept outputs (label -> pickled canonical form) with the seed's output, in canonical form."
    seed = copy_as(base, "lazy")
    run_torch(seed, {}, impl="seed")
    ref = oracle.canonical(seed)
    del seed
    words = []
    for label, out in outs.items():
        diff = oracle.mismatch(ref, pickle.loads(out), ("seed", label))
        words.append(f"{label} == seed: " + ("IDENTICAL" if diff is None else "DIFFERENT\n" + "\n".join(diff.splitlines()[:30])))
    return "; ".join(words)

# ----------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------


def fmt_gc(counts: list) -> str:
    "Median collections per generation over the runs, as 'gen0/gen1/gen2'."
    return "/".join(f"{statistics.median([c.get(f'gen{g}', 0) for c in counts]):g}" for g in range(3))


def fmt_row(r: dict) -> str:
    t, ref = r["times"], r["ref"]
    ratio = f"{ref / t['total']:>8.2f}x" if ref else f"{'':>9}"
    spread = f"{min(r['totals']):.2f}-{max(r['totals']):.2f}"
    return (f"{r['shape']:<9}{r['size']:>7}{r['in']:>8}{r['out']:>8} {r['row']:<18}"
            + "".join(f"{t.get(c, float('nan')):>9.2f}" for c in COLS)
            + f" {spread:>12}{t['total'] / r['out'] * 1e6:>9.1f}{ratio}{fmt_gc(r['gcs']):>12}{'ok' if r['gc_ok'] else 'CHANGED':>8}")


HEAD = (f"{'shape':<9}{'size':>7}{'in':>8}{'out':>8} {'impl':<18}" + "".join(f"{c:>9}" for c in COLS)
        + f" {'spread':>12}{'us/node':>9}{'vs torch':>9}{'collections':>12}{'gc':>8}")


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
            if hasattr(P, "paused_gc"):   # the pipeline's pause and each stream_pass's (streamnb.fastfx.paused_gc)
                import streamnb.fastfx as F
                with mock.patch.object(P, "paused_gc", contextlib.nullcontext), \
                        mock.patch.object(F, "paused_gc", contextlib.nullcontext):
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


# issue 50, item 1: like for like at 100k final nodes; time per node flat within 1.3x from 10k to 100k
TARGETS = {"streamnb upstream": {"backward": 3.0, "dag": 2.5, "stress": 1.6},
           "streamnb default": {"backward": 2.0, "dag": 1.2, "stress": 1.0}}


def targets(results: list, shapes: list, sizes: list) -> str:
    "The `like` table's ratios at the largest size against issue 50's targets, and its flatness."
    big, small = max(sizes), min(sizes)
    per = {(r["shape"], r["row"], r["size"]): r for r in results if r["path"] == "like" and r["kind"] == results[0]["kind"]}
    lines = [f"\n## issue 50's targets, like for like at {big} (median ratio; met if >= target; flatness <= 1.3)"]
    for row, wants in TARGETS.items():
        for shape in shapes:
            r, want = per.get((shape, row, big)), wants.get(shape)
            if r is None or want is None: continue
            ratio = r["ref"] / r["times"]["total"]
            flat = "" if big == small else (lambda f: f"; flatness {f:.2f} {'met' if f <= 1.3 else 'NOT met'}")(
                (r["times"]["total"] / r["out"]) / (per[shape, row, small]["times"]["total"] / per[shape, row, small]["out"]))
            lines.append(f"{row:<18} {shape:<9} {ratio:5.2f}x against {want}x: {'met' if ratio >= want else 'NOT met'}{flat}")
    return "\n".join(lines)


def pattern_syncs() -> str:
    """The syncs (`count_syncs`, stream ops but fork/join) in the joint graph after the seed's passes (`upstream=True`)
    and the default's, for each real pattern of `streamnb.patterns` in both styles (captured as `explain` does)."""
    import copy
    from streamnb.capturing import capture
    from streamnb.cpustreams import cpu_streams
    from streamnb.graph import StreamRegistry, use_registry
    from streamnb.patterns import PATTERNS, STYLES, build as build_pattern
    from streamnb.pipeline import run_stream_passes
    from streamnb.streamops import count_syncs
    lines = ["\n## syncs a GPU pays for, per real pattern (streamnb.patterns; joint graph after the passes)",
             f"{'pattern':<20}{'style':<10}{'seed':>6}{'default':>9}"]
    warnings.filterwarnings("ignore", category=FutureWarning)   # torch 2.13's own TreeSpec warning on deepcopy
    for name in PATTERNS:
        for style in STYLES:
            try:
                model, inputs = build_pattern(name, style)
                with cpu_streams(): cap = capture(model, *inputs)
                got = []
                for upstream in (True, False):
                    joint = copy.deepcopy(cap.joint)
                    with use_registry(StreamRegistry(start=100, current_stream=cap.current_stream)):
                        run_stream_passes(joint, upstream=upstream, fw_metadata=copy.copy(cap.fw_metadata))
                    got.append(count_syncs(joint))
                lines.append(f"{name:<20}{style:<10}{got[0]:>6}{got[1]:>9}")
            except Exception as e:   # say it and go on: a pattern the seed refuses, a capture that fails here
                lines.append(f"{name:<20}{style:<10}  {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    ap.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000],
                    help="final node counts (after PyTorch's pipeline), about")
    ap.add_argument("--paths", nargs="+", choices=list(PATHS), default=["like", "aot", "heap"],
                    help="like (the headline): each pass alone, gc.disable() around both sides; aot: the same with the "
                         "collector on; heap: aot with the caller holding --heap long-lived objects; "
                         "pipeline: run_stream_passes vs torch, collector on")
    ap.add_argument("--kinds", nargs="+", choices=KINDS, default=["lazy"])
    ap.add_argument("--repeat", type=int, default=5, help="interleaved runs per measurement (median kept)")
    ap.add_argument("--stat", choices=["median", "best"], default="median", help="what of the --repeat runs is printed")
    ap.add_argument("--heap", type=int, default=HEAP, help="long-lived objects the heap table's caller holds")
    ap.add_argument("--no-syncs", action="store_true", help="skip the syncs per real pattern (streamnb.patterns)")
    ap.add_argument("--layer", type=int, default=LAYER, help="nodes per layer of the backward shape (>= 15)")
    ap.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs")
    ap.add_argument("--no-check", action="store_true", help="skip the identity check against the seed")
    ap.add_argument("--clock", choices=list(CLOCKS), default="cpu",
                    help="wall: time.perf_counter; cpu: time.process_time, this process's CPU time only (less noisy when "
                         "other jobs share the cores; the collector's work counts in both)")
    ap.add_argument("--profile", action="store_true",
                    help="only profile streamnb (and the GC/codegen shares) at the largest size of the first shape")
    ap.add_argument("--profile-out", metavar="DIR", help="with --profile: also write the cProfile stats files here")
    a = ap.parse_args(argv)
    global clock
    clock = CLOCKS[a.clock]
    logging.getLogger("torch._inductor.utils").setLevel(logging.ERROR)
    print(describe_code(), flush=True)
    if a.profile:
        profile(a.shapes[0], max(a.sizes), a.layer, a.profile_out)
        return 0

    results, checks, memory, syncs = [], [], [], []
    keys = list(dict.fromkeys(measurement(path, row) for path in a.paths for row in ROWS))
    print(f"\nclock {a.clock}; {a.stat} of {a.repeat} runs per measurement, in turn: " + ", ".join(
        f"{r} {h}{' gc off' if off else ''}{' heap' if hp else ''}" for r, h, off, hp in keys)
        + f"; the heap measurements after the others, in turn too, the caller holding {a.heap:,} objects")
    print("\n" + f"{'path':<9}{'kind':<6}" + HEAD, flush=True)
    for shape in a.shapes:
        for size in a.sizes:
            t0 = time.perf_counter()
            base = build(shape, size, a.layer)
            n_in = len(base.graph.nodes)
            print(f"# {shape} {size}: {n_in} input nodes, built in {time.perf_counter() - t0:.1f} s", flush=True)
            outs = {}
            for kind in a.kinds:
                keep = set() if a.no_check or kind != a.kinds[0] else \
                    {k for k in keys if k[0] != "streamnb default" and not k[3]}   # (every table's, heap's but)
                runs = best_runs(base, kind, a.repeat, keys, keep, a.stat, a.heap)
                syncs.append(f"{shape:<9}{size:>7}  seed (upstream=True) {runs[measurement(a.paths[0], ROWS[1])][6]:>6}"
                             f"  default {runs[measurement(a.paths[0], ROWS[2])][6]:>6}"
                             f"  torch 2.13 {runs[measurement(a.paths[0], ROWS[0])][6]:>6}")
                for k in (k for k in keys if k in keep): outs[f"{k[0]} ({k[1]})"] = runs[k][3]
                for path in a.paths:
                    ref = runs[measurement(path, "torch 2.13")][0]["total"]
                    for row in ROWS:
                        times, ok, n_out, _, totals, gcs, _ = runs[measurement(path, row)]
                        r = dict(shape=shape, size=size, kind=kind, path=path, row=row, times=times, gc_ok=ok,
                                 totals=totals, gcs=gcs,
                                 **{"in": n_in}, out=n_out, ref=ref if row != "torch 2.13" else None)
                        results.append(r)
                        print(f"{path:<9}{kind:<6}" + fmt_row(r), flush=True)
                del runs
            if outs:
                checks.append(f"{shape} {size} ({n_in} in): " + identity(base, outs))
                print("  " + checks[-1], flush=True)
            del outs
            if not a.no_memory and size == max(a.sizes):
                for k in keys:
                    if k[2] or k[3]: continue   # the collector off (or a heap) changes no allocation of the passes
                    label = f"{k[0]} ({k[1]})"
                    memory.append(f"{shape:<9}{size:>7} {label:<30} {peak_memory(k, base):>9.0f} MiB")
                    print("  peak " + memory[-1], flush=True)
            del base

    for path in a.paths:
        for kind in a.kinds:
            title = PATHS[path][0] + ("; lazy module in (as AOTAutograd), codegen deferred on both sides"
                                      if kind == "lazy" else "; plain GraphModule in, codegen counted on both sides")
            print(f"\n## {path}, {kind}: {title}\n(seconds; vs torch = torch's total / this total)\n" + HEAD)
            for r in results:
                if r["kind"] == kind and r["path"] == path: print(fmt_row(r))
            if len(a.sizes) > 1:
                s0, s1 = min(a.sizes), max(a.sizes)
                per = {(r["shape"], r["row"], r["size"]): r["times"]["total"] / r["out"]
                       for r in results if r["kind"] == kind and r["path"] == path}
                for shape in a.shapes:
                    print(f"flatness {shape}: us/node at {s1} / at {s0}: " + ", ".join(
                        f"{row} {per[shape, row, s1] / per[shape, row, s0]:.2f}" for row in ROWS))
    if checks: print("\n## identity (canonical form, against PyTorch's seed)\n" + "\n".join(checks))
    if "like" in a.paths: print(targets(results, a.shapes, a.sizes))
    if syncs: print("\n## syncs a GPU pays for, per shape (count_syncs of each row's output: stream ops but fork/join)\n"
                    + "\n".join(syncs))
    if not a.no_syncs: print(pattern_syncs())
    if memory: print("\n## peak Python memory (tracemalloc, separate run, lazy kind, above the run's start)\n"
                     + "\n".join(memory))
    print("\n" + describe_code())
    return 0


if __name__ == "__main__":
    sys.exit(main())
