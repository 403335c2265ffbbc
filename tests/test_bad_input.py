"""Issue 22, requirement 4: every public function x every bad form of input.

Each case builds a small backward graph, spoils it one way, calls one public function and asserts: the error type,
that the message names the node (`node <name>`), and that the graph is exactly as it was (`canonical(gm)`, every
node's meta, `gm.meta`, the submodules). A legal form (keyword-argument syncs) must not raise. `NEEDS` lists the
functions that must refuse a form; the others may either refuse it the same way or run (a function that never reads
`meta['val']` need not look at it), but may never half-run. Then the pipeline's atomicity and retry, shared meta
under `copy.deepcopy`, the processed mark under `GraphModule(gm, gm.graph)`, and argument types.
"""
import copy
import types
import warnings

import pytest
import torch
from torch.fx import GraphModule

from streamnb.assign import assign_backward_streams, assign_epilogue_copy_streams
from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps
from streamnb.dealloc import sync_deallocations
from streamnb.graph import (AlreadyProcessedWarning, GraphBuilder, MissingValError, StreamAnnotationError, StreamnbError,
                            StreamRegistry, canonical, streams, use_registry)
from streamnb.metadata import populate_fw_metadata_with_stream_indices
from streamnb.pipeline import run_stream_passes
from streamnb.sanitizer import sanitize
from streamnb.simulator import simulate

aten = torch.ops.aten
CASES = {"run": 0}


@pytest.fixture(autouse=True, scope="module")
def _print_cases():
    yield
    print(f"\nbad-input cases run: {CASES['run']}")


def fw_metadata(n=1):
    return types.SimpleNamespace(num_mutated_inp_runtime_indices=n)


FUNCS = {
    "assign_backward_streams": assign_backward_streams,
    "assign_epilogue_copy_streams": assign_epilogue_copy_streams,
    "insert_backward_syncs": __import__("streamnb.syncs", fromlist=["x"]).insert_backward_syncs,
    "sync_deallocations": sync_deallocations,
    "wrap_all_sync_nodes_with_control_deps": wrap_all_sync_nodes_with_control_deps,
    "populate_fw_metadata_with_stream_indices": lambda gm: populate_fw_metadata_with_stream_indices(gm, fw_metadata()),
    "run_stream_passes": run_stream_passes,
    "sanitize": sanitize,
    "simulate": simulate,
}
ALL = frozenset(FUNCS)
READ_VAL = frozenset({"insert_backward_syncs", "sync_deallocations", "run_stream_passes", "simulate"})


def base_graph(keyword=False, module=False):
    """x, tangents_1 -> a = x * t (stream 1) -> record_event(40, 1) -> c = a + x (stream 0: `a` crosses streams) ->
    d = relu(c) (stream 2) -> wait_event(40, 2) -> g = a + a (gradient accumulation, no stream); returns (a, d, g).
    `module`: `m = lin(a)` on stream 2, a call_module node."""
    b = GraphBuilder()
    x, t = b.input("x", tag="is_forward"), b.input("tangents_1")
    a = b.op(aten.mul.Tensor, x, t, stream=1, name="a")
    sync = (lambda tg, names, *args: b.graph.call_function(tg, (), dict(zip(names, args)))) if keyword else \
           (lambda tg, names, *args: b.sync(tg, *args))
    sync(streams.record_event.default, ("event_index", "stream_index"), 40, 1)
    c = b.op(aten.add.Tensor, a, x, stream=0, name="c")
    d = b.op(aten.relu.default, c, stream=2, name="d")
    sync(streams.wait_event.default, ("event_index", "stream_index"), 40, 2)
    g = b.op(aten.add.Tensor, a, a, acc=True, name="g")
    g.meta["custom"] = {"note": "kept"}       # a custom dict without a stream: the assign pass fills it in
    outs = [a, d, g]
    if module:
        b.gm.add_submodule("lin", torch.nn.ReLU())
        m = b.graph.call_module("lin", (a,))
        m.meta.update(val=torch.empty(4, 4, device="meta"), custom={"stream": 2}, partitioner_tag="is_backward")
        outs.append(m)
    return b.output(*outs)


def node(gm, name):
    return next(n for n in gm.graph.nodes if n.name == name)


def set_args(name, *args):
    def spoil(gm):
        node(gm, name).args = args
        return name
    return spoil


def set_custom(value, name="a"):
    def spoil(gm):
        node(gm, name).meta["custom"] = value
        return name
    return spoil


def del_val(gm):
    del node(gm, "a").meta["val"]
    return "a"


def str_val(gm):
    node(gm, "a").meta["val"] = "not a tensor"
    return "a"


def sync_dealloc_without_tensor(gm):
    c = node(gm, "c")
    with gm.graph.inserting_after(c):
        gm.graph.call_function(streams.sync_dealloc.default, (40, 1))
    return "sync_dealloc_default"


def use_before_definition(gm):
    node(gm, "a").prepend(node(gm, "c"))   # c reads a, and now comes before it
    return ("c", "a")


@pytest.fixture
def unknown_stream_op():
    "A `streams::` op streamnb does not know (defined for the test, removed after)."
    lib = torch.library.Library("streams", "FRAGMENT")
    lib.define("streamnb_test_unknown(SymInt event_index, SymInt stream_index) -> ()")
    yield torch.ops.streams.streamnb_test_unknown.default
    lib._destroy()


def unknown_op(gm):
    op = torch.ops.streams.streamnb_test_unknown.default
    node(gm, "record_event_default").target = op
    return "record_event_default"


def corrupt_control_deps(gm):
    "Process the graph, then point the first control_deps node at a submodule that does not exist."
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm)
    ctrl = next(n for n in gm.graph.nodes if n.op == "call_function" and "control_deps" in n.name)
    sub = ctrl.args[1]
    delattr(gm, sub.target)
    return ctrl.name


# form -> (spoil(gm) -> the node name(s) the message must name, the error type, the functions that must raise)
FORMS = {
    "missing val": (del_val, MissingValError, READ_VAL),
    "non-tensor val on a cross-stream producer": (str_val, StreamnbError, READ_VAL),
    "custom not a dict": (set_custom(["stream", 1]), StreamnbError, ALL),
    "stream -1": (set_custom({"stream": -1}), StreamnbError, ALL),
    "stream 2**70": (set_custom({"stream": 2**70}), StreamnbError, ALL),
    "stream 1.5": (set_custom({"stream": 1.5}), StreamAnnotationError, ALL),
    "stream True": (set_custom({"stream": True}), StreamAnnotationError, ALL),
    "stream '1'": (set_custom({"stream": "1"}), StreamAnnotationError, ALL),
    "wait_event(7)": (set_args("wait_event_default", 7), StreamnbError, ALL),
    "record_event()": (set_args("record_event_default"), StreamnbError, ALL),
    "float stream": (set_args("record_event_default", 40, 1.5), StreamnbError, ALL),
    "sync_dealloc without a tensor": (sync_dealloc_without_tensor, StreamnbError, ALL),
    "unknown stream op": (unknown_op, StreamnbError, ALL),
    "use before definition (fails lint)": (use_before_definition, StreamnbError, ALL),
    "corrupt control_deps": (corrupt_control_deps, StreamnbError, frozenset({"sanitize", "simulate"})),
    "call_module with a stream": (None, StreamnbError, ALL),
}


def _plain(v):
    "A comparable copy of a meta value (tensors by shape, dtype, device and strides)."
    if isinstance(v, torch.Tensor): return ("tensor", tuple(v.shape), v.dtype, str(v.device), v.stride())
    if isinstance(v, dict): return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)): return type(v)(_plain(x) for x in v)
    return repr(v)


def snapshot(gm):
    "Everything a pass may change: the graph (subgraphs included), each node's meta, gm.meta, the submodules."
    try: can = canonical(gm)
    except Exception as e: can = repr(e)   # canonical itself cannot read some spoiled graphs (a non-dict custom)
    own = [(n.name, n.op, str(n.target), repr(n.args), repr(n.kwargs)) for n in gm.graph.nodes]
    return (can, own, [(n.name, _plain(n.meta)) for n in gm.graph.nodes], _plain(dict(gm.meta)),
            sorted(name for name, _ in gm.named_children()), gm.code)


def call(fn, gm):
    with use_registry(StreamRegistry(start=100, current_stream=0)), warnings.catch_warnings():
        warnings.simplefilter("ignore", AlreadyProcessedWarning)
        return fn(gm)


@pytest.mark.parametrize("func", list(FUNCS))
@pytest.mark.parametrize("form", list(FORMS))
def test_bad_form(form, func, request):
    spoil, exc, needs = FORMS[form]
    if form == "unknown stream op": request.getfixturevalue("unknown_stream_op")
    if spoil is None:
        gm, names = base_graph(module=True), ("lin",)
    else:
        gm = base_graph()
        names = spoil(gm)
        names = (names,) if isinstance(names, str) else names
    before = snapshot(gm)
    CASES["run"] += 1
    try:
        call(FUNCS[func], gm)
    except Exception as e:
        assert isinstance(e, exc), f"{type(e).__name__} instead of {exc.__name__}: {e}"
        assert any(f"node {n}" in str(e) for n in names), f"the message names none of {names}: {e}"
        assert snapshot(gm) == before, "the graph changed before the error"
        return
    assert func not in needs, f"{func} accepted the {form} and returned"
    if func not in ("sanitize", "simulate", "populate_fw_metadata_with_stream_indices") and form != "corrupt control_deps":
        return   # a pass that ran: nothing more to compare
    assert snapshot(gm) == before, f"{func} changed the graph"


@pytest.mark.parametrize("func", list(FUNCS))
def test_keyword_form_syncs_are_legal(func):
    "record_event(event_index=..., stream_index=...) is read like its positional twin: no error, the same result."
    kw, pos = base_graph(keyword=True), base_graph()
    CASES["run"] += 1
    out_kw, out_pos = call(FUNCS[func], kw), call(FUNCS[func], pos)
    if func == "sanitize":
        assert out_kw.ok == out_pos.ok and out_kw.kinds == out_pos.kinds
    elif func == "simulate":
        assert out_kw.spans == out_pos.spans
    norm = keyword_to_positional
    assert norm(canonical(kw, rename_events=False)) == norm(canonical(pos, rename_events=False))
    if func == "run_stream_passes":
        assert sanitize(kw, registry=StreamRegistry(start=100, current_stream=0), reorder=True).ok


# ---------------------------------------------------------------------------------------------------------------
# Arguments of the wrong type: a TypeError naming the argument
# ---------------------------------------------------------------------------------------------------------------

def _plot_none():
    from streamnb.plot import plot_timeline
    plot_timeline(None)


ARG_CASES = {
    **{f"{f}(None)": (lambda f=f: FUNCS[f](None), "gm") for f in FUNCS},
    "sanitize(gm.graph)": (lambda: sanitize(base_graph().graph), "gm"),
    "simulate(gm.graph)": (lambda: simulate(base_graph().graph), "gm"),
    "run_stream_passes(gm.graph)": (lambda: run_stream_passes(base_graph().graph), "gm"),
    "simulate(cost=lambda n: 'x')": (lambda: simulate(base_graph(), cost=lambda n: "x"), "cost"),
    "plot_timeline(None)": (_plot_none, "timeline"),
    "populate_fw_metadata(gm, None)": (lambda: populate_fw_metadata_with_stream_indices(base_graph(), None), "fw_metadata"),
    "populate_fw_metadata(gm, object())": (lambda: populate_fw_metadata_with_stream_indices(base_graph(), object()), "fw_metadata"),
}


@pytest.mark.parametrize("case", list(ARG_CASES))
def test_wrong_argument_type(case):
    fn, arg = ARG_CASES[case]
    CASES["run"] += 1
    with use_registry(StreamRegistry(start=100, current_stream=0)), pytest.raises(TypeError) as info:
        fn()
    assert arg in str(info.value), str(info.value)


@pytest.mark.parametrize("func", ["sync_deallocations", "run_stream_passes"])
def test_unknown_device(func):
    gm = base_graph()
    before = snapshot(gm)
    CASES["run"] += 1
    with pytest.raises((StreamnbError, ValueError)) as info:
        call(lambda g: FUNCS[func](g, device="X100"), gm)
    assert "X100" in str(info.value)
    assert snapshot(gm) == before


# ---------------------------------------------------------------------------------------------------------------
# The pipeline is atomic, and a retry after fixing the input gives a first run's graph
# ---------------------------------------------------------------------------------------------------------------

def fresh_result(**kw):
    gm = base_graph()
    call(lambda g: run_stream_passes(g, **kw), gm)
    return snapshot(gm)


@pytest.mark.parametrize("bad, fix", [
    (dict(device="X100"), dict()),                                  # sync_deallocations, the 4th pass, refuses it
    (dict(fw_metadata=object()), dict(fw_metadata=fw_metadata())),  # read after all five passes
    (dict(mechanism="no_such_mechanism"), dict()),
])
def test_pipeline_error_in_a_later_pass_leaves_the_graph_unchanged_and_a_retry_works(bad, fix):
    gm = base_graph()
    before = snapshot(gm)
    CASES["run"] += 1
    with pytest.raises(Exception):
        call(lambda g: run_stream_passes(g, **bad), gm)
    assert snapshot(gm) == before
    with warnings.catch_warnings():
        warnings.simplefilter("error", AlreadyProcessedWarning)   # the retry must run every pass, not skip one
        call(lambda g: run_stream_passes(g, **fix), gm)
    assert snapshot(gm) == fresh_result(**fix)


@pytest.mark.parametrize("func", [f for f in FUNCS if f not in ("sanitize", "simulate")])
def test_a_pass_on_a_bad_val_later_in_the_graph_is_atomic(func):
    "A node late in the graph without meta['val'] (after nodes the pass would already have rewritten)."
    gm = base_graph()
    d = node(gm, "d")
    with gm.graph.inserting_after(d):
        late = gm.graph.call_function(aten.mul.Tensor, (d, node(gm, "a")), name="late")
    late.meta.update(custom={"stream": 3}, partitioner_tag="is_backward")   # no val: reads d across streams
    with gm.graph.inserting_after(late):   # ... and is read across streams: the passes need its device
        user = gm.graph.call_function(aten.neg.default, (late,), name="late_user")
    user.meta.update(custom={"stream": 0}, partitioner_tag="is_backward", val=node(gm, "d").meta["val"])
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.args = (out.args[0] + (user,),)
    gm.recompile()
    before = snapshot(gm)
    CASES["run"] += 1
    try:
        call(FUNCS[func], gm)
    except Exception as e:
        assert isinstance(e, StreamnbError) and "node late" in str(e), repr(e)
        assert snapshot(gm) == before
    else:
        assert func not in READ_VAL, f"{func} ran on a node without meta['val']"


def test_passes_on_a_deepcopy_do_not_change_the_original():
    gm = base_graph()
    before = snapshot(gm)
    custom = {n.name: n.meta.get("custom") for n in gm.graph.nodes}
    custom_plain = {k: copy.deepcopy(v) for k, v in custom.items()}
    CASES["run"] += 1
    call(lambda g: run_stream_passes(g, fw_metadata=fw_metadata()), copy.deepcopy(gm))
    assert snapshot(gm) == before
    assert {k: copy.deepcopy(v) for k, v in custom.items()} == custom_plain   # shared meta values untouched


def test_a_rewrapped_graph_module_is_still_processed():
    gm = base_graph()
    call(run_stream_passes, gm)
    again = GraphModule(gm, gm.graph)
    before = snapshot(again)
    CASES["run"] += 1
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with use_registry(StreamRegistry(start=100, current_stream=0)):
            run_stream_passes(again)
    assert any(issubclass(x.category, AlreadyProcessedWarning) for x in w)
    assert snapshot(again)[:3] == before[:3], "syncs inserted a second time"
    assert sum(1 for n in again.graph.nodes if "record_event" in n.name or "control_deps" in n.name) == \
        sum(1 for n in gm.graph.nodes if "record_event" in n.name or "control_deps" in n.name)


def keyword_to_positional(c):
    "`canonical` rows with the stream ops' keyword arguments moved to their positions (schema order), subgraphs too."
    return [(r[0], r[1], r[2], r[3] + tuple(r[4].values()), {}, *r[5:7], r[7] and keyword_to_positional(r[7]))
            if str(r[2]).startswith("streams.") else (*r[:7], r[7] and keyword_to_positional(r[7])) for r in c]
