"""Inside `torch.compile` (issue 23, item 3): compile a deep model with streams, with and without `use_streamnb_passes`,
and print the compile time spent in the stream passes.

    python benchmarks/bench_compile.py                    # 24 blocks, each with a branch on stream 1 and one on stream 2
    python benchmarks/bench_compile.py --model transformer --blocks 24   # streamnb.examples.TransformerBlock

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
(dynamo, AOTAutograd, the passes, the partitioner); `share`, passes / compile; the forward and backward graphs' node
counts and their `control_deps` nodes. A last line says, for streamnb's rows, whether the joint graph the switch
processed is the one `capture(model, x).process()` gives (what `streamnb.explain` shows), in canonical form up to
input names (untimed, after the rows). All on the CPU (`streamnb.capturing.cpu_streams`, graphs' values as meta
tensors for the passes: `cpu_as="meta"`). Nothing is asserted on time; compare rows of one run.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import time
from unittest import mock

import sys
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import oracle  # noqa: E402  (its GPU stubs, for torch's own passes on a CPU)

from streamnb import compiling
from streamnb.capturing import PartitionError, capture
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
def timed_call_sites(times: dict, stubs: bool = False):
    """Wrap each stream pass at AOTAutograd's call sites (whatever is installed there now) with a timer into `times`;
    `stubs`: run it under tests/oracle.py's GPU stubs (torch's own passes on a CPU, as bench_passes.py runs them)."""
    gc_mod = importlib.import_module(CALL_SITES)
    def timed(fn, short):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                with stubbed() if stubs else contextlib.nullcontext(): return fn(*args, **kwargs)
            finally: times[short] = times.get(short, 0.0) + time.perf_counter() - t0
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


def compile_once(model: nn.Module, x: torch.Tensor, mode: str) -> dict:
    "Compile `model` under `mode`, run forward and backward once; times and graph sizes."
    torch._dynamo.reset()
    graphs, times = {}, {}
    switch = {"torch 2.13": contextlib.nullcontext(), "streamnb default": use_streamnb_passes(cpu_as="meta"),
              "streamnb upstream": use_streamnb_passes(upstream=True, cpu_as="meta")}[mode]
    t0, error = time.perf_counter(), None
    try:
        with switch, timed_call_sites(times, stubs=mode == "torch 2.13"):
            compiled = torch.compile(model, backend=executor_backend(graphs), fullgraph=True)
            out = compiled(x.detach().requires_grad_(True))
        out.sum().backward()
    except Exception as e:   # the passes ran (and were timed); what failed after them is said in the row
        error = next((ln for ln in str(e).splitlines() if "Error: " in ln), type(e).__name__)
    total = time.perf_counter() - t0
    sizes = {k: (len(g[0].graph.nodes), sum(map(is_control_deps, g[0].graph.nodes))) for k, g in graphs.items()}
    same = None if mode == "torch 2.13" or not switch.graphs else same_as_explain(model, x, switch, mode, error)
    return dict(times=times, total=total, sizes=sizes, error=error, same=same)


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
    ap.add_argument("--modes", nargs="+", default=["torch 2.13", "streamnb default", "streamnb upstream"])
    a = ap.parse_args(argv)
    model = deep_model(a.model, a.blocks, a.d, a.heads, a.hidden)
    x = torch.randn(2, 8, a.d)
    what = {"branches": f"SideBranches blocks (d={a.d}, hidden={a.hidden}): one branch on stream 1, one on stream 2",
            "transformer": f"TransformerBlocks (d={a.d}, heads={a.heads}, hidden={a.hidden}): attention on stream 1, MLP "
                           "on stream 2"}[a.model]
    print(f"{a.blocks} {what}; torch {torch.__version__}; one compile (forward + backward) per row, CPU\n")
    cols = list(SHORT.values())
    print(f"{'row':<18} {'passes s':>8} {'run_pass':>8} " + " ".join(f"{c:>8}" for c in cols)
          + f" {'compile s':>9} {'share':>6}  forward nodes (ctrl)  backward nodes (ctrl)")
    sames = []
    for mode in a.modes:
        r = compile_once(model, x, mode)
        inner = r["times"].pop("run_pass", None)
        passes = sum(r["times"].values())
        fw, bw = r["sizes"].get("forward", (0, 0)), r["sizes"].get("backward", (0, 0))
        print(f"{mode:<18} {passes:8.2f} {'' if inner is None else f'{inner:8.2f}':>8} " + " ".join(f"{r['times'].get(c, 0.0):8.2f}" for c in cols)
              + f" {r['total']:9.1f} {passes / r['total']:6.1%}  "
              + (f"{fw[0]:>7} ({fw[1]:>4})        {bw[0]:>7} ({bw[1]:>4})" if r["error"] is None
                 else f"failed after the passes: {r['error'][:90]}"), flush=True)
        if r["same"] is not None:
            sames.append(f"{mode}: {r['same']}")
    if sames:
        print("\nthe joint graph the switch processed against capture(model, x).process()'s (the graphs explain shows), "
              "canonical form up to input names: " + "; ".join(sames))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
