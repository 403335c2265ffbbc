"""Issue 22, the legal forms the syncs and wrap passes must read: host values crossing streams (correction 16),
multi-output ops with getitems on other streams, in-place writes and reads through aliases (correction 10), epilogue
writes ordered along data edges (correction 6), keyword and packet forms of the stream ops (correction 11), and a
clear error naming the node, before any change, for an unknown or malformed stream op.

Judged by the sanitizer with `reorder=True` (every order of the data edges and control_deps)."""
import operator

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import graphgen
from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps as wrap
from streamnb.graph import GraphBuilder, StreamnbError, StreamRegistry, canonical, is_control_deps, streams, use_registry
from streamnb.pipeline import run_stream_passes
from streamnb.sanitizer import sanitize
from streamnb.syncs import HostValueError, insert_backward_syncs

aten = torch.ops.aten
SEED_FAILS = pytest.param(True, marks=pytest.mark.xfail(strict=True, reason="the seed's defect"), id="upstream")
REC, WAIT = streams.record_event.default, streams.wait_event.default


def passes(gm, upstream=False, full=True):
    "The pipeline (or only the syncs and wrap passes), with a fresh registry whose current stream is 0."
    reg = StreamRegistry(start=10, current_stream=0)
    with use_registry(reg):
        if full: run_stream_passes(gm, upstream=upstream)
        else:
            insert_backward_syncs(gm, upstream=upstream)
            wrap(gm, upstream=upstream)
    return gm, reg


def hazards(gm, reg):
    "Races and reorder hazards on the data (not the frees: chapter 12's business)."
    return [e.message for e in sanitize(gm, registry=reg, reorder=True).errors
            if e.kind in ("race", "reorderable") and "free" not in e.message.split("\n")[0]]


def symint():
    return ShapeEnv().create_unbacked_symint()


# --- host values crossing streams (correction 16) -------------------------------------------------------------------

def host_graph(tensor_edge_first=True):
    "`sym_size` on stream 1 read by `view` on stream 0; before it a tensor edge `mul` (1) -> `add` (0)."
    b = GraphBuilder()
    g = b.input("tangents_1")
    outs = []
    if tensor_edge_first:
        m = b.op(aten.mul.Tensor, g, g, stream=1)
        outs.append(b.op(aten.add.Tensor, m, g, stream=0))
    n = b.op(aten.sym_size.int, g, 0, stream=1, val=symint())
    outs.append(b.op(aten.view.default, g, [n, 4], stream=0, val=torch.empty(4, 4, device="meta")))
    return b.output(*outs)


@pytest.mark.parametrize("upstream", [SEED_FAILS, False])
def test_correction_16_host_value_needs_no_sync(upstream):
    gm = host_graph()
    with use_registry(StreamRegistry(start=10, current_stream=0)) as reg:
        insert_backward_syncs(gm, upstream=upstream)
    waits = [n for n in gm.graph.nodes if n.target is WAIT]
    assert [w.next.name for w in waits] == ["add"]        # the tensor edge only; nothing before `view`
    assert [e for e in sanitize(gm, registry=reg).errors if e.kind == "race"] == []


def test_host_value_seed_error_names_the_node_before_any_change():
    gm = host_graph()   # the seed would insert mul's record and wait, then fail on sym_size
    before = canonical(gm)
    with pytest.raises(HostValueError, match=r"^node sym_size: its value \(SymInt\)"):
        with use_registry(StreamRegistry(start=10, current_stream=0)):
            insert_backward_syncs(gm, upstream=True)
    assert canonical(gm) == before
    with use_registry(StreamRegistry(start=10, current_stream=0)):
        insert_backward_syncs(gm)   # not marked processed: the default then runs
    assert len([n for n in gm.graph.nodes if n.target is WAIT]) == 1


@pytest.mark.parametrize("val", [3, 2.5, True, None])
def test_host_values_of_every_kind(val):
    b = GraphBuilder()
    g = b.input("tangents_1")
    n = b.op(aten.sym_size.int, g, 0, stream=1, val=val)
    b.op(aten.view.default, g, [n, 4], stream=0, val=torch.empty(4, 4, device="meta"))
    gm = b.output(g)
    before = canonical(gm)
    with use_registry(StreamRegistry(start=10, current_stream=0)):
        insert_backward_syncs(gm)
    assert canonical(gm) == before


def test_host_value_through_the_pipeline():
    # a dynamic-shape backward: the size is read on another stream and a reshape uses it
    b = GraphBuilder()
    g = b.input("tangents_1")
    m = b.op(aten.mul.Tensor, g, g, stream=1)
    n = b.op(aten.sym_size.int, m, 0, stream=1, val=symint())
    v = b.op(aten.view.default, m, [n, 4], stream=0, val=torch.empty(4, 4, device="meta"))
    r = b.op(aten.relu.default, v, stream=0)
    gm, reg = passes(b.output(r))
    assert any(is_control_deps(x) for x in gm.graph.nodes)
    gm.graph.lint()
    assert sanitize(gm, registry=reg, reorder=True).ok


def test_host_value_is_not_a_use_of_the_memory():
    # sym_size reads no device memory: an in-place write after it on another stream waits for nothing
    b = GraphBuilder()
    g = b.input("tangents_1")
    a = b.op(aten.mul.Tensor, g, g, stream=0)
    n = b.op(aten.sym_size.int, a, 0, stream=1, val=symint())
    w = b.op(aten.add_.Tensor, a, g, stream=0)
    gm = b.output(w, n)
    with use_registry(StreamRegistry(start=10, current_stream=0)):
        insert_backward_syncs(gm)
    waits = [x for x in gm.graph.nodes if x.target is WAIT]
    assert [w.next.name for w in waits] == ["sym_size"]   # (the seed's tensor edge a -> sym_size); none before add_


# --- multi-output ops with getitems on other streams ----------------------------------------------------------------

@pytest.mark.parametrize("op_s,item_s,use_s", [(0, 1, 2), (0, 1, 1), (0, 1, 0), (0, None, 1), (1, 0, 0), (2, 1, 0)])
@pytest.mark.parametrize("multi", ["native_layer_norm", "var_mean"])
def test_multi_output_getitems_on_other_streams(op_s, item_s, use_s, multi):
    b = GraphBuilder()
    g = b.input("tangents_1")
    x = b.op(aten.relu.default, g, stream=op_s)
    if multi == "native_layer_norm": t = b.op(aten.native_layer_norm.default, x, [4], None, None, 1e-5, stream=op_s)
    else: t = b.op(aten.var_mean.correction, x, [1], correction=1, keepdim=True, stream=op_s)
    items = [b.op(operator.getitem, t, i, stream=item_s) for i in range(len(t.meta["val"]))]
    uses = [b.op(aten.sin.default, i, stream=use_s) for i in items]
    gm, reg = passes(b.output(*uses), full=False)   # (chapter 12's frees are left out: its own tests)
    assert hazards(gm, reg) == []
    gm.graph.lint()


def test_multi_output_in_generated_graphs():
    for seed in range(25):
        gm = graphgen.random_alias_graph(seed, p_view=0, p_inplace=0, p_split=0, p_multi=0.35, p_user_sync=0)
        gm, reg = passes(gm, full=False)
        assert hazards(gm, reg) == [], f"seed {seed}"


def triton_like(x):
    "Stands for `triton_kernel_wrapper_functional`: its value is a dict of the tensors the kernel writes."
    return {"out": x.sin(), "aux": x.cos()}


@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
def test_dict_valued_kernel_output_is_a_dep_through_its_getitems(upstream):
    """A Triton kernel's dict on stream 1, one result read by name (annotated stream 0) before a user's record on stream 1:
    the record must not depend on the dict itself (AOTAutograd's partitioner expects a node read other than through
    getitems to be a tensor); newer PyTorch expands dict deps (PR #187498), the default does as for tuples (14)."""
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    k = b.op(triton_like, x, stream=1, tag="is_forward")
    out = b.op(operator.getitem, k, "out", stream=0, tag="is_forward")   # (a getitem does no work: any stream)
    b.sync(REC, 3, 1, tag="is_forward")
    aux = b.op(operator.getitem, k, "aux", stream=1, tag="is_forward")
    gm, reg = passes(b.output(b.op(aten.add.Tensor, out, aux, stream=1, tag="is_forward")), upstream=upstream)
    deps = [d for n in gm.graph.nodes if is_control_deps(n) for d in n.args[0]]
    assert out in deps and k not in deps


# --- writes and reads through aliases (correction 10) ---------------------------------------------------------------

def write_through_alias(kind="t"):
    "`mul` (stream 0) read through a view on stream 1 by `sin`; then written in place on stream 0."
    b = GraphBuilder()
    g = b.input("tangents_1")
    a = b.op(aten.mul.Tensor, g, g, stream=0)
    v = (b.op(aten.t.default, a, stream=1) if kind == "t" else
         b.op(aten.expand.default, b.op(aten.slice.Tensor, a, 0, 0, 1, stream=1), [4, 4], stream=1))
    r = b.op(aten.sin.default, v, stream=1)
    w = (b.op(aten.add_.Tensor, a, g, stream=0) if kind != "copy" else b.op(aten.copy_.default, a, g, stream=0))
    return b.output(r, w)


@pytest.mark.parametrize("upstream", [SEED_FAILS, False])
@pytest.mark.parametrize("kind", ["t", "slice_expand", "copy"])
def test_correction_10_write_through_alias_waits_for_reads(upstream, kind):
    gm, reg = passes(write_through_alias(kind), upstream)
    assert hazards(gm, reg) == []


def test_write_into_a_view_waits_for_reads_of_the_base():
    b = GraphBuilder()
    g = b.input("tangents_1")
    a = b.op(aten.mul.Tensor, g, g, stream=0)
    r = b.op(aten.sin.default, a, stream=1)
    v = b.op(aten.t.default, a, stream=2)
    w = b.op(aten.mul_.Tensor, v, g, stream=2)
    gm, reg = passes(b.output(r, w))
    assert hazards(gm, reg) == []


@pytest.mark.parametrize("upstream", [SEED_FAILS, False])
def test_correction_10_read_after_in_place_write(upstream):
    # `sin` reads `a` itself (not the add_ node) after the in-place write on another stream
    b = GraphBuilder()
    g = b.input("tangents_1")
    a = b.op(aten.mul.Tensor, g, g, stream=0)
    w = b.op(aten.add_.Tensor, a, g, stream=0)
    v = b.op(aten.t.default, a, stream=1)
    r = b.op(aten.sin.default, v, stream=1)
    gm, reg = passes(b.output(r, w), upstream)
    assert hazards(gm, reg) == []


def test_in_place_writes_in_generated_graphs():
    for seed in range(25):
        gm = graphgen.random_alias_graph(seed, p_view=0.25, p_inplace=0.25, p_multi=0, p_split=0, p_user_sync=0)
        gm, reg = passes(gm, full=False)
        assert hazards(gm, reg) == [], f"seed {seed}"


# --- epilogue copy_ ordered along data edges (correction 6, for correction 10's syncs) -------------------------------

def tangent_write_back(src_is_tangent=True):
    b = GraphBuilder()
    x = b.input("primals_2", tag="is_forward")
    g = b.input("tangents_1")
    v = b.op(aten.mul.Tensor, g, g, stream=0)
    n = b.op(aten.neg.default, v, stream=1)
    r = b.op(aten.relu.default, x, stream=1)
    c = b.op(aten.copy_.default, x, g if src_is_tangent else v, stream=0)
    return b.output(r, n, c)


@pytest.mark.parametrize("src_is_tangent", [True, False])
def test_correction_6_epilogue_copy_war_holds_along_data_edges(src_is_tangent):
    gm, reg = passes(tangent_write_back(src_is_tangent))
    assert sanitize(gm, registry=reg, reorder=True).ok
    copy = next(n for n in gm.graph.nodes if n.target is aten.copy_.default)
    wait = copy.args[1].args[0]   # the copy's source is read through the last wait before it
    assert is_control_deps(wait) and wait.args[1].target.startswith("subgraph_wait_event")


def test_copy_of_one_graph_input_into_another_holds_along_data_edges():
    # copy_(primals_1, primals_2): no backward input to thread; a graph input is, its getitem tagged for the backward
    b = GraphBuilder()
    p1, p2 = b.input("primals_1", tag="is_forward"), b.input("primals_2", tag="is_forward")
    r = b.op(aten.add.Tensor, p1, p1, stream=1)
    c = b.op(aten.copy_.default, p1, p2, stream=0)
    gm, reg = passes(b.output(r, c))
    assert sanitize(gm, registry=reg, reorder=True).ok
    copy = next(n for n in gm.graph.nodes if n.target is aten.copy_.default)
    assert [a.meta["partitioner_tag"] for a in copy.args if a.target is operator.getitem] == ["must_be_in_backward"]


def test_epilogue_copy_war_generated_under_reorder():
    for seed in range(0, 120, 3):
        gm, reg = passes(graphgen.random_backward_graph(seed, p_copy=0.1, p_unannotated=0.5, p_user_sync=0.3))
        rep = sanitize(gm, registry=reg, reorder=True)
        assert rep.ok, f"seed {seed}: " + "\n".join(e.message for e in rep.errors)


# --- keyword and packet forms; unknown and malformed stream ops ------------------------------------------------------

def record_wait_in_form(form):
    "`mul` on stream 1, recorded as event 7; stream 0 waits for it and `neg` reads `mul`; the syncs in `form`."
    b = GraphBuilder()
    x = b.input("x")
    mul = b.op(aten.mul.Tensor, x, x, stream=1)
    for op, kw in ((streams.record_event, {"event_index": 7, "stream_index": 1}),
                   (streams.wait_event, {"event_index": 7, "stream_index": 0})):
        if form == "keyword": b.graph.call_function(op.default, (), kw)
        elif form == "packet": b.graph.call_function(op, tuple(kw.values()))
        else: b.graph.call_function(op.default, tuple(kw.values()))
    neg = b.op(aten.neg.default, mul, stream=0)
    return b.output(neg, mul)


@pytest.mark.parametrize("form", ["positional", "keyword", "packet"])
def test_wrap_reads_every_form(form):
    gm = record_wait_in_form(form)
    reg = StreamRegistry(start=10, current_stream=0)
    with use_registry(reg): wrap(gm)
    assert len([n for n in gm.graph.nodes if is_control_deps(n)]) == 2   # both syncs wrapped
    assert not any(n.op == "call_function" and str(n.target).startswith("streams.") for n in gm.graph.nodes)
    assert sanitize(gm, registry=reg, reorder=True).ok


@pytest.mark.parametrize("upstream", [SEED_FAILS, False])
def test_correction_11_packet_form_is_wrapped(upstream):
    # the seed's `node.target in _SYNC_OPS` misses `torch.ops.streams.wait_event` (the packet): left bare, `neg` floats
    gm = record_wait_in_form("packet")
    reg = StreamRegistry(start=10, current_stream=0)
    with use_registry(reg): wrap(gm, upstream=upstream)
    assert sanitize(gm, registry=reg, reorder=True).ok


def test_seed_wrap_reads_the_keyword_form():
    # the seed reads node.args[0] and fails with an IndexError half-way; upstream=True reads it as the positional form
    a, b = record_wait_in_form("keyword"), record_wait_in_form("positional")
    for gm in (a, b):
        with use_registry(StreamRegistry(start=10, current_stream=0)): wrap(gm, upstream=True)
    deps = lambda gm: [tuple(d.name for d in n.args[0]) for n in gm.graph.nodes if is_control_deps(n)]
    assert deps(a) == deps(b) == [("mul",), ("control_deps",)]


def _unknown_stream_op():
    lib = torch.library.Library("streams", "FRAGMENT")   # (kept alive by the module-level reference below)
    if not hasattr(torch.ops.streams, "streamnb_test_mystery"):
        lib.define("streamnb_test_mystery(int stream_index) -> ()")
    return lib, torch.ops.streams.streamnb_test_mystery.default


@pytest.mark.parametrize("upstream", [True, False])
@pytest.mark.parametrize("bad", ["unknown", "missing_arg", "float_stream"])
def test_wrap_refuses_bad_stream_ops_naming_the_node_before_any_change(upstream, bad):
    b = GraphBuilder()
    x = b.input("x")
    mul = b.op(aten.mul.Tensor, x, x, stream=1)
    b.sync(REC, 7, 1)
    if bad == "unknown":
        global _LIB
        _LIB, target = _unknown_stream_op()
        n = b.graph.call_function(target, (0,), name="mystery")
    elif bad == "missing_arg": n = b.graph.call_function(WAIT, (7,), name="mystery")
    else: n = b.graph.call_function(WAIT, (7, 0.5), name="mystery")
    gm = b.output(b.op(aten.neg.default, mul, stream=0))
    before = canonical(gm)
    with pytest.raises(StreamnbError, match=r"^node mystery: "):
        with use_registry(StreamRegistry(start=10, current_stream=0)): wrap(gm, upstream=upstream)
    assert canonical(gm) == before
