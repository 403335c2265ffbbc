"""PyTorch's own stream passes as a CPU oracle for streamnb's `upstream=True` mode.

torch 2.13 ships the stream passes in `torch/_functorch/_aot_autograd/streams.py`. They run on FX graphs on a
CPU-only build once the few things they take from the live machine are stubbed:

* `new_event` / `get_current_stream` (imported by name into the streams module): one shared counter, as in
  torch, where both take the next index of dynamo's object registry (so every current-stream lookup gets a
  *fresh* index);
* `get_gpu_dram_gbps` (imports triton) and `get_device_tflops`: constants (`DRAM_GBPS`, `TFLOPS`);
* `torch.cuda.is_available` / `torch.accelerator.is_available`: True while a pass runs ("gpu" mode, what a
  CUDA machine does) or left False ("cpu" mode: the seed adds the `record_stream` fallback). They are forced
  only around the pass calls; forcing them for the whole process breaks AOT tracing.

The seed streamnb implements is torch 2.13's file minus the later `wait_stream` support and with
`torch.cuda.is_available()` in the record_stream fallback (torch 2.13's `streams.py`). `load_impl("seed")`
derives that variant in memory from the installed source (each edit's anchor must occur exactly once) and
executes it as a module of the `torch._functorch._aot_autograd` package; `load_impl("torch")` is the
installed module unchanged.

`run_torch` runs torch's passes, `run_streamnb` runs streamnb's under an equivalent registry and device spec,
`mismatch` compares two processed graphs with `streamnb.graph.canonical(rename_events=True)`.
"""
from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import importlib
import inspect
import itertools
import pprint
import re
import types
from typing import Any, Callable, Iterator
from unittest import mock

import torch
import torch.fx
from torch.fx import GraphModule

STREAMS_MOD = "torch._functorch._aot_autograd.streams"
PACKAGE = "torch._functorch._aot_autograd"
CALL_SITES = "torch._functorch._aot_autograd.graph_capture"


def torch_pipeline() -> tuple[str, ...]:
    """The joint-graph passes in the order the installed torch runs them: the functions of streams.py that
    graph_capture's `aot_dispatch_autograd_graph` calls on the joint graph alone (`name(fx_g)`), read from its source
    (not from streamnb, which the oracle judges; test_oracle checks streamnb's table against it)."""
    src = inspect.getsource(importlib.import_module(CALL_SITES).aot_dispatch_autograd_graph)
    ours = vars(importlib.import_module(STREAMS_MOD))
    return tuple(n for n in re.findall(r"\b(\w+)\(fx_g\)", src) if inspect.isfunction(ours.get(n)))


# The joint-graph passes in the order graph_capture.py runs them, and the forward-only wrap.
PIPELINE = torch_pipeline()
WRAP = PIPELINE[-1:]
MODES = ("gpu", "cpu")

# Device numbers the roofline helpers get (stubs on torch's side, a DeviceSpec on streamnb's).
DRAM_GBPS = 1000.0
TFLOPS = 100.0
START = 10   # first index of the shared event / current-stream counter

# ----------------------------------------------------------------------------------------------------------------
# The seed variant of streams.py, derived in memory
# ----------------------------------------------------------------------------------------------------------------

# (why, old, new): plain replacements; `old` must occur exactly once.
_REPLACE = (
    ("the seed's _SYNC_OPS has no wait_stream", "    torch.ops.streams.wait_stream.default,\n", ""),
    ("the seed's record_stream fallback asks torch.cuda",
     "if not torch.accelerator.is_available():", "if not torch.cuda.is_available():"),
)
# (why, start, end): cut the text from `start` (inclusive) to `end` (exclusive); `start` must occur once.
_CUT = (
    ("the seed has no wait_stream helper",
     "def _collect_wait_stream_forward_deps", "def wrap_all_sync_nodes_with_control_deps"),
    ("the seed does not call it",
     "    # Pre-pass: find inputs of waiting-stream nodes", "    stream_to_nodes: dict[int | None, list[Node]] = {}"),
    ("the seed has no wait_stream branch",
     "                # wait_stream(waiting, waited_on) creates a dependency on",
     "                event_index: int = node.args[0]"),
)


class AnchorError(RuntimeError):
    "The installed streams.py does not look like torch 2.13's: an edit's anchor is missing or not unique."


def derive_seed_source(src: str | None = None) -> str:
    "The seed's streams.py, derived from torch 2.13's (`src`, default: the installed module's source)."
    if src is None: src = inspect.getsource(importlib.import_module(STREAMS_MOD))
    for why, old, new in _REPLACE:
        if src.count(old) != 1: raise AnchorError(f"{why}: anchor {old.strip()!r} found {src.count(old)} times")
        src = src.replace(old, new)
    for why, start, end in _CUT:
        if src.count(start) != 1: raise AnchorError(f"{why}: anchor {start.strip()!r} found {src.count(start)} times")
        i = src.index(start)
        j = src.find(end, i + len(start))
        if j < 0: raise AnchorError(f"{why}: end anchor {end.strip()!r} not found after the start")
        src = src[:i] + src[j:]
    if "wait_stream" in src: raise AnchorError("wait_stream still mentioned in the derived seed source")
    return src


@functools.lru_cache(maxsize=None)
def load_impl(name: str = "seed") -> types.ModuleType:
    "`'seed'`: the derived seed module (built once, never written to disk); `'torch'`: the installed module."
    if name == "torch": return importlib.import_module(STREAMS_MOD)
    if name != "seed": raise ValueError(f"unknown implementation {name!r}; use 'seed' or 'torch'")
    mod = types.ModuleType("streamnb_oracle_seed_streams")
    mod.__package__ = PACKAGE  # for `from .indexed_dict import IndexedDict`
    exec(compile(derive_seed_source(), "<seed streams.py, derived from torch 2.13>", "exec"), mod.__dict__)
    return mod

# ----------------------------------------------------------------------------------------------------------------
# Stubs
# ----------------------------------------------------------------------------------------------------------------


class Counter:
    "Stands in for dynamo's object registry: events and current-stream lookups share one counter."
    def __init__(self, start: int = START):
        self._next = itertools.count(start)
        self.log: list[tuple[str, int]] = []

    def new_event(self, *args, **kwargs) -> int:
        i = next(self._next); self.log.append(("event", i)); return i

    def get_current_stream(self, device=None) -> int:
        i = next(self._next); self.log.append((f"current_stream({device})", i)); return i


@contextlib.contextmanager
def torch_env(impl: types.ModuleType, counter: Counter, dram_gbps: float = DRAM_GBPS,
              tflops: float = TFLOPS) -> Iterator[Counter]:
    "Patch index allocation (in `impl`'s and torch's streams namespaces) and the roofline device helpers."
    mods = {id(m): m for m in (impl, importlib.import_module(STREAMS_MOD))}.values()
    with contextlib.ExitStack() as st:
        for m in mods:
            st.enter_context(mock.patch.object(m, "new_event", counter.new_event))
            st.enter_context(mock.patch.object(m, "get_current_stream", counter.get_current_stream))
        st.enter_context(mock.patch("torch.utils._runtime_estimation.get_gpu_dram_gbps", lambda: dram_gbps))
        st.enter_context(mock.patch("torch.utils._runtime_estimation.get_device_tflops", lambda dtype: tflops))
        yield counter


@contextlib.contextmanager
def availability(mode: str) -> Iterator[None]:
    "`torch.cuda/accelerator.is_available()` return True ('gpu') or False ('cpu') inside the block."
    if mode not in MODES: raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    on = mode == "gpu"
    with mock.patch("torch.cuda.is_available", lambda: on), mock.patch("torch.accelerator.is_available", lambda: on):
        yield


def torch_pass(impl: types.ModuleType, name: str, mode: str) -> Callable:
    "`impl.<name>` wrapped so that it runs under `availability(mode)` (for patching into graph_capture)."
    fn = getattr(impl, name)
    def run(*args, **kwargs):
        with availability(mode): return fn(*args, **kwargs)
    return run

# ----------------------------------------------------------------------------------------------------------------
# Copying graphs
# ----------------------------------------------------------------------------------------------------------------


def copy_gm(gm: GraphModule, cls: type = GraphModule) -> GraphModule:
    """An independent copy of `gm` for a second run of the passes, as a `cls` (e.g. FX's `_LazyGraphModule`,
    what AOTAutograd hands to the passes: its code is generated only when used).

    Node metas are copied shallowly (tensors in `val`/`value` are shared: the passes never change them), except
    `custom`, which `set_stream` updates in place: those dicts are deep-copied with one memo, so nodes that
    shared a dict in `gm` share one in the copy."""
    g = torch.fx.Graph()
    env: dict = {}
    memo: dict = {}
    for old in gm.graph.nodes:
        new = env[old] = g.node_copy(old, lambda a: env[a])
        new.meta = dict(old.meta)
        if "custom" in old.meta: new.meta["custom"] = copy.deepcopy(old.meta["custom"], memo)
    new_gm = cls(gm, g)
    new_gm.meta.update({k: v for k, v in gm.meta.items() if k != "streamnb_passes"})
    return new_gm

# ----------------------------------------------------------------------------------------------------------------
# Running both implementations
# ----------------------------------------------------------------------------------------------------------------


def run_torch(gm: GraphModule, passes: tuple[str, ...] = PIPELINE, *, impl: str = "seed", mode: str = "gpu",
              start: int = START) -> GraphModule:
    "Run PyTorch's passes (`impl` 'seed' or 'torch') on `gm` in place, in order; returns `gm`."
    mod = load_impl(impl)
    with torch_env(mod, Counter(start)):
        for p in passes: torch_pass(mod, p, mode)(gm)
    return gm


def device_spec():
    "A `streamnb.cost.DeviceSpec` whose numbers equal the oracle's stubs (one TFLOP/s figure for every dtype)."
    from streamnb.cost import DeviceSpec
    return DeviceSpec("oracle", bf16_tflops=TFLOPS, fp16_tflops=TFLOPS, tf32_tflops=TFLOPS, fp32_tflops=TFLOPS,
                      fp64_tflops=TFLOPS, hbm_gbps=DRAM_GBPS, source="tests/oracle.py stubs")


def mechanism(mode: str) -> str:
    "The streamnb dealloc mechanism that corresponds to torch's behaviour in `mode`."
    return {"gpu": "sync_dealloc", "cpu": "record_stream"}[mode]


def run_streamnb(gm: GraphModule, passes: tuple[str, ...] = PIPELINE, *, mode: str = "gpu", start: int = START,
                 upstream: bool = True, device: Any = None, registry: Any = None) -> GraphModule:
    """Run streamnb's passes on `gm` in place under `registry` (default `StreamRegistry(start)`), through
    `run_stream_passes` (`passes` picks from its table, in pipeline order, as `run_torch` runs them)."""
    from streamnb.graph import StreamRegistry, use_registry
    from streamnb.pipeline import run_stream_passes
    if list(passes) != [p for p in PIPELINE if p in passes]: raise ValueError(f"passes not in pipeline order: {passes}")
    dev = device_spec() if device is None else device
    with use_registry(StreamRegistry(start=start) if registry is None else registry):
        run_stream_passes(gm, upstream=upstream, mechanism=mechanism(mode), device=dev, passes=passes)
    return gm

# ----------------------------------------------------------------------------------------------------------------
# Comparing
# ----------------------------------------------------------------------------------------------------------------


def canonical(gm: GraphModule) -> list[tuple]:
    "The comparable form: streamnb's `canonical`, with event indices renamed by first appearance."
    from streamnb.graph import canonical as canon
    return canon(gm, rename_events=True)


def mismatch(a: GraphModule | list, b: GraphModule | list, labels: tuple[str, str] = ("expected", "got")) -> str | None:
    "None if both graphs have the same canonical form; else a unified diff of the two forms."
    ca = a if isinstance(a, list) else canonical(a)
    cb = b if isinstance(b, list) else canonical(b)
    if ca == cb: return None
    fa = [pprint.pformat(t, width=160) for t in ca]
    fb = [pprint.pformat(t, width=160) for t in cb]
    return "\n".join(difflib.unified_diff(fa, fb, *labels, lineterm="", n=2))


def check(make: Callable[[], GraphModule], passes: tuple[str, ...] = PIPELINE, *, mode: str = "gpu",
          impl: str = "seed", start: int = START) -> str | None:
    "Build the graph twice, run torch's passes on one and streamnb's (upstream=True) on the other, compare."
    ref = run_torch(make(), passes, impl=impl, mode=mode, start=start)
    ours = run_streamnb(make(), passes, mode=mode, start=start)
    return mismatch(ref, ours, (f"torch[{impl}]", "streamnb"))

# ----------------------------------------------------------------------------------------------------------------
# Real joint graphs
# ----------------------------------------------------------------------------------------------------------------


class _Captured(Exception):
    "Raised after the wrap pass to end AOTAutograd's compilation once the joint graph is captured."


def capture_joint(fn: Callable, *inputs: torch.Tensor, impl: str = "seed", mode: str = "gpu",
                  start: int = START) -> tuple[GraphModule, GraphModule]:
    """Trace `fn` with `functorch.compile.aot_function` and return (the joint graph before the stream passes,
    the same graph after torch's passes, taken right after the wrap pass, before the metadata pass and DCE).
    Compilation stops there, so `fn` is traced but never compiled or run.

    The pass names in `graph_capture` are patched: the first records a copy of its input, then each runs
    `impl`'s pass under the stubs and `availability(mode)`."""
    import torch._functorch._aot_autograd.graph_capture as GC
    from functorch.compile import aot_function, make_boxed_func
    mod = load_impl(impl)
    got: dict[str, GraphModule] = {}

    def spy(p: str):
        run = torch_pass(mod, p, mode)
        def wrapped(gm, *a, **k):
            if p == PIPELINE[0]: got["before"] = copy_gm(gm)
            r = run(gm, *a, **k)
            if p == PIPELINE[-1]:
                got["after"] = copy_gm(gm)
                raise _Captured  # stop: the passes' output is all we compare (torch 2.13's partitioner may reject it)
            return r
        return wrapped

    compiler = lambda gm, _: make_boxed_func(gm.forward)
    with torch_env(mod, Counter(start)), contextlib.ExitStack() as st:
        for p in PIPELINE: st.enter_context(mock.patch.object(GC, p, spy(p)))
        try: aot_function(fn, fw_compiler=compiler, bw_compiler=compiler)(*inputs)
        except _Captured: pass
    if "before" not in got: raise RuntimeError("aot_function did not run the stream passes (no joint graph?)")
    return got["before"], got["after"]
