"""Inside `torch.compile` (issue 23, item 3; issue 50, item 3): compile a deep model with streams, with and without `use_streamnb_passes`,
and print the compile time spent in the stream passes.

    python benchmarks/bench_compile.py                    # 24 blocks, each with a branch on stream 1 and one on stream 2
    python benchmarks/bench_compile.py --model transformer --blocks 24   # streamnb.examples.TransformerBlock
    python benchmarks/bench_compile.py --backend inductor                 # a whole compile (minutes on a CPU)

The model is `--blocks` blocks deep, small enough for a CPU: `SideBranches` (two MLP branches, one annotated
`on_stream(1)`, one `on_stream(2)`, multiplied into the residual) or `streamnb.examples.TransformerBlock` (attention on
stream 1, the MLP on stream 2). On either, torch 2.13's own passes (and `upstream=True`, the seed's) leave a joint graph
that AOTAutograd's partitioner rejects (correction 7): their rows time the passes and say where compilation stopped. Each row compiles it from scratch (`torch._dynamo.reset()`), with the
`aot_autograd` backend that keeps each graph as it comes out (nothing lowered), and runs one forward and one backward,
so AOTAutograd builds the joint graph, runs the stream passes and partitions it. Rows:

* `torch 2.13`: PyTorch's own passes (what `torch.compile` runs today);
* `streamnb default` / `streamnb upstream`: inside `use_streamnb_passes()` / `use_streamnb_passes(upstream=True)`.

Columns: `passes s`, the time in the stream passes, measured at AOTAutograd's call sites
(`torch._functorch._aot_autograd.graph_capture`, each pass's function wrapped with a timer, so it counts what
`use_streamnb_passes` does around each pass too: on a CPU, `cpu_as="meta"` converts every value of the graph to a meta
tensor and back, for each pass); `run_pass`, the part of it in `streamnb.pipeline.run_pass`, the passes themselves
(what a GPU machine pays, where nothing is converted); one column per pass (the call sites' time); `compile s`, the first forward plus backward
(dynamo, AOTAutograd, the passes, the partitioner; with `--backend inductor`, Inductor's codegen and compiler too: a
whole compile); `share`, passes / compile; `around`, passes - run_pass: what the switch does around the passes (on a
CPU, `cpu_as="meta"`: converting values to meta tensors and back; issue 50's goal: less than the passes themselves);
the forward and backward graphs' node counts and their `control_deps` nodes.

Then `downstream` (issue 50, item 3): the joint graph the wrap pass was given, after the compile (the passes' output),
for every row, torch's included: its `control_deps` subgraph modules, the CPU time to generate their code (each is a
lazy module until then) and to pickle the whole module with Inductor's `FxGraphCachePickler` (as its FX graph cache
does to key the graph; `GraphModule.__reduce__` generates every module's code again), the pickle's size and the cost
per subgraph. Then the default's row against issue 50's goals (share at most 1%; around less than run_pass).
Times are CPU seconds (`time.process_time`; `--clock wall` for wall-clock). A last line says, for streamnb's rows, whether the joint graph the switch
processed is the one `capture(model, x).process()` gives (what `streamnb.explain` shows), in canonical form up to
input names (untimed, after the rows). All on the CPU (`streamnb.capturing.cpu_streams`, graphs' values as meta
tensors for the passes: `cpu_as="meta"`). Nothing is asserted on time; compare rows of one run.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import pickle
import time
from unittest import mock

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import oracle  # noqa: E402  (its GPU stubs, for torch's own passes on a CPU)

from streamnb import compiling
from streamnb.capturing import capture
from streamnb.tracing import PartitionError
from streamnb.compiling import CALL_SITES, canonical_modulo_inputs, executor_backend, renumber_streams, use_streamnb_passes
from streamnb.examples import TransformerBlock, on_stream
from streamnb.graph import StreamRegistry, is_control_deps
from streamnb.pipeline import STREAM_PASSES

SHORT = {"assign_backward_streams": "assign", "assign_epilogue_copy_streams": "epilogue",
         "insert_backward_syncs": "syncs", "sync_deallocations": "dealloc",
         "wrap_all_sync_nodes_with_control_deps": "wrap", "populate_fw_metadata_with_stream_indices": "metadata"}


class SideBranches(nn.Module):
    "A block whose two branches run on side streams 1 and 2 (no layer norm: torch 2.13's own passes partition it)."
    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.up1, self.down1 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.up2, self.down2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
    def forward(self, x):
        with on_stream(1): a = self.down1(torch.relu(self.up1(x)))
        with on_stream(2): b = self.down2(torch.tanh(self.up2(x)))
        return x + a * b


def deep_model(kind: str, blocks: int, d: int, heads: int, hidden: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    make = {"transformer": lambda: TransformerBlock(d, heads, hidden), "branches": lambda: SideBranches(d, hidden)}[kind]
    return nn.Sequential(*(make() for _ in range(blocks)))


@contextlib.contextmanager
def timed_call_sites(times: dict, stubs: bool = False, joints: list | None = None):
    """Wrap each stream pass at AOTAutograd's call sites (whatever is installed there now) with a timer into `times`;
    `stubs`: run it under tests/oracle.py's GPU stubs (torch's own passes on a CPU, as bench_passes.py runs them);
    `joints`: the graph module the wrap pass was given (the joint graph, after it the passes' output) is appended."""
    gc_mod = importlib.import_module(CALL_SITES)
    def timed(fn, short):
        def run(*args, **kwargs):
            if short == "wrap" and joints is not None and args: joints.append(args[0])
            t0 = clock()
            try:
                with stubbed() if stubs else contextlib.nullcontext(): return fn(*args, **kwargs)
            finally: times[short] = times.get(short, 0.0) + clock() - t0
        return run
    with contextlib.ExitStack() as st:
        for name, short in SHORT.items():
            if hasattr(gc_mod, name): st.enter_context(mock.patch.object(gc_mod, name, timed(getattr(gc_mod, name), short)))
        # streamnb's rows: the passes themselves, without what `use_streamnb_passes` does around them
        st.enter_context(mock.patch.object(compiling, "run_pass", timed(compiling.run_pass, "run_pass")))
        yield


@contextlib.contextmanager
def stubbed():
    "torch's passes on the CPU: `is_available()` True and the roofline's device numbers stubbed (tests/oracle.py)."
    with oracle.torch_env(oracle.load_impl("torch"), COUNTER), oracle.availability("gpu"):
        yield

COUNTER = oracle.Counter()   # dynamo's index registry, as the oracle stands in for it


clock = time.process_time   # CPU seconds of this process (--clock wall: time.perf_counter)


def downstream(gm) -> dict:
    """What the passes' output costs after them, as Inductor's FX graph cache pays it: the `control_deps` subgraph
    modules' count, the time to generate their code (each is lazy until then) and to pickle the whole graph module
    with `FxGraphCachePickler` (which generates each module's code again through `GraphModule.__reduce__`)."""
    from torch._inductor.codecache import FxGraphCachePickler
    from torch.fx._lazy_graph_module import _LazyGraphModule
    subs = [m for _, m in gm.named_children() if isinstance(m, torch.fx.GraphModule)]
    t0 = clock()
    for m in subs:
        _LazyGraphModule.force_recompile(m)
        m.code
    t1 = clock()
    try: size = len(FxGraphCachePickler(gm).dumps(gm)); how = "FxGraphCachePickler"
    except Exception:   # a value the cache's pickler refuses: plain pickle, said in the row
        size = len(pickle.dumps(gm)); how = "pickle"
    t2 = clock()
    return dict(subs=len(subs), codegen=t1 - t0, pickle=t2 - t1, size=size, how=how)


def compile_once(model: nn.Module, x: torch.Tensor, mode: str, backend: str = "executor") -> dict:
    "Compile `model` under `mode`, run forward and backward once; times, graph sizes and the output's downstream cost."
    torch._dynamo.reset()
    graphs, times, joints = {}, {}, []
    switch = {"torch 2.13": contextlib.nullcontext(), "streamnb default": use_streamnb_passes(cpu_as="meta"),
              "streamnb upstream": use_streamnb_passes(upstream=True, cpu_as="meta")}[mode]
    t0, error = clock(), None
    try:
        with switch, timed_call_sites(times, stubs=mode == "torch 2.13", joints=joints):
            compiled = torch.compile(model, backend=executor_backend(graphs) if backend == "executor" else backend,
                                     fullgraph=True)
            out = compiled(x.detach().requires_grad_(True))
        out.sum().backward()
    except Exception as e:   # the passes ran (and were timed); what failed after them is said in the row
        error = next((ln for ln in str(e).splitlines() if "Error: " in ln), type(e).__name__)
    total = clock() - t0
    sizes = {k: (len(g[0].graph.nodes), sum(map(is_control_deps, g[0].graph.nodes))) for k, g in graphs.items()}
    same = None if mode == "torch 2.13" or not switch.graphs else same_as_explain(model, x, switch, mode, error)
    down = downstream(joints[0]) if joints else None
    return dict(times=times, total=total, sizes=sizes, error=error, same=same, down=down)


def same_as_explain(model: nn.Module, x: torch.Tensor, switch, mode: str, error: str | None) -> str:
    """Is the joint graph the switch processed, up to input names, what `capture(model, x).process()` gives (the
    graphs `streamnb.explain` shows), with the switch's renumbered regions and its current stream? Where the compile
    failed in the partitioner, `process` must fail there too."""
    cap = capture(model, x.detach().requires_grad_(True), frontend="dynamo")   # (as compiled: x needs its grad)
    if switch.renumbered[0]: renumber_streams(cap.joint, switch.renumbered[0])
    reg = switch.registries[0]
    cur = reg.pinned_current if reg.pinned_current is not None else cap.current_stream
    try:
        joint = cap.process(upstream=mode == "streamnb upstream", registry=StreamRegistry(start=100, current_stream=cur)).joint
    except PartitionError:
        return "both rejected by the partitioner" if error is not None else "DIFFERENT (process fails, the compile does not)"
    if error is not None: return "DIFFERENT (the compile fails, process does not)"
    return "IDENTICAL" if canonical_modulo_inputs(switch.graphs[0]) == canonical_modulo_inputs(joint) else "DIFFERENT"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["branches", "transformer"], default="branches")
    ap.add_argument("--blocks", type=int, default=24)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--backend", choices=["executor", "inductor"], default="executor",
                    help="executor: AOTAutograd's graphs run as they come out (nothing lowered: a short run); inductor: "
                         "a whole compile, Inductor's codegen and C++ compiler included (minutes on a CPU)")
    ap.add_argument("--modes", nargs="+", default=["torch 2.13", "streamnb default", "streamnb upstream"])
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="cpu: time.process_time (this process's CPU seconds, for a shared machine); wall: perf_counter")
    a = ap.parse_args(argv)
    global clock
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    model = deep_model(a.model, a.blocks, a.d, a.heads, a.hidden)
    x = torch.randn(2, 8, a.d)
    what = {"branches": f"SideBranches blocks (d={a.d}, hidden={a.hidden}): one branch on stream 1, one on stream 2",
            "transformer": f"TransformerBlocks (d={a.d}, heads={a.heads}, hidden={a.hidden}): attention on stream 1, MLP "
                           "on stream 2"}[a.model]
    print(f"{a.blocks} {what}; torch {torch.__version__}; one compile (forward + backward) per row, CPU; "
          f"{a.clock} seconds; backend {a.backend}\n")
    cols = list(SHORT.values())
    print(f"{'row':<18} {'passes s':>8} {'run_pass':>8} {'around':>8} " + " ".join(f"{c:>8}" for c in cols)
          + f" {'compile s':>9} {'share':>6}  forward nodes (ctrl)  backward nodes (ctrl)")
    sames, downs, goals = [], [], []
    for mode in a.modes:
        r = compile_once(model, x, mode, a.backend)
        inner = r["times"].pop("run_pass", None)
        passes = sum(r["times"].values())
        around = None if inner is None else passes - inner
        fw, bw = r["sizes"].get("forward", (0, 0)), r["sizes"].get("backward", (0, 0))
        print(f"{mode:<18} {passes:8.2f} {'' if inner is None else f'{inner:8.2f}':>8} "
              f"{'' if around is None else f'{around:8.2f}':>8} " + " ".join(f"{r['times'].get(c, 0.0):8.2f}" for c in cols)
              + f" {r['total']:9.1f} {passes / r['total']:6.1%}  "
              + (f"{fw[0]:>7} ({fw[1]:>4})        {bw[0]:>7} ({bw[1]:>4})" if r["error"] is None
                 else f"failed after the passes: {r['error'][:90]}"), flush=True)
        if r["same"] is not None:
            sames.append(f"{mode}: {r['same']}")
        if (d := r["down"]) is not None:
            per = (d["codegen"] + d["pickle"]) / d["subs"] * 1e6 if d["subs"] else 0.0
            downs.append(f"{mode:<18} {d['subs']:>8} {d['codegen']:>9.2f} {d['pickle']:>9.2f} {d['size'] / 2**20:>8.1f}"
                         f" {per:>10.0f}  {d['how']}")
        if mode == "streamnb default":
            goals.append(f"passes' share of the compile: {passes / r['total']:.1%} (goal at most 1%): "
                         + ("met" if passes / r["total"] <= 0.01 else "NOT met"))
            if inner is not None:
                goals.append(f"the switch around the passes: {around:.2f} s against the passes' {inner:.2f} s "
                             "(goal: less than the passes): " + ("met" if around < inner else "NOT met"))
    if downs:
        print("\ndownstream: the joint graph after the passes (as the compile left it), its control_deps subgraph modules' "
              "code generated, then the whole module pickled as Inductor's FX graph cache does (which generates every "
              f"module's code again)\n{'row':<18} {'subgraphs':>8} {'codegen s':>9} {'pickle s':>9} {'MiB':>8} {'us/subgraph':>10}"
              "  pickler\n" + "\n".join(downs))
    if goals: print("\nissue 50, item 3 (streamnb default):\n" + "\n".join(goals))
    if sames:
        print("\nthe joint graph the switch processed against capture(model, x).process()'s (the graphs explain shows), "
              "canonical form up to input names: " + "; ".join(sames))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
