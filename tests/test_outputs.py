"""The caller reads a graph's outputs on its current stream (issue 27, item 8).

The sanitizer counts the `output` node as a read of every returned tensor on the current stream at the end of the
graph (`unjoined_output` when its last write, on a side stream, is not ordered before it), and correction 17 of
`insert_backward_syncs` joins each side stream that last wrote a returned backward value: one record after its last
such writer, one wait on the current stream before the output. On main's code (no such rule, no such correction)
`test_correction_17_last_node_on_a_side_stream_is_joined` and every test that expects `unjoined_output` fail."""
import copy

import pytest
import torch

import graphgen
from streamnb.cpustreams import run_graph
from streamnb.graph import CORRECTIONS, GraphBuilder, StreamRegistry, aten, streams, use_registry
from streamnb.pipeline import run_stream_passes
from streamnb.sanitizer import sanitize
from streamnb.streamops import decode
from streamnb.syncs import insert_backward_syncs

REC, WAIT = streams.record_event.default, streams.wait_event.default


def reg():
    return StreamRegistry(start=100, current_stream=0)


def passes(gm, upstream=False, only_syncs=False):
    "The default (or the seed's) passes on `gm` in place, with stream 0 as the current stream; the registry used."
    r = reg()
    with use_registry(r):
        if only_syncs: insert_backward_syncs(gm, upstream=upstream)
        else: run_stream_passes(gm, upstream=upstream)
    return r


def unjoined(gm, registry=None, **kw):
    return [(e.nodes, e.streams, e.tensor) for e in sanitize(gm, registry=registry or reg(), **kw).errors
            if e.kind == "unjoined_output"]


def syncs(gm):
    return [(decode(n).kind, n.args) for n in gm.graph.nodes if n.op == "call_function" and n.target in (REC, WAIT)]


def weight_grad():
    "A backward whose last node, `w_grad` (stream 1), is a returned gradient; `x_grad` is made on the current stream."
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    g = b.input("tangents_1")
    xg = b.op(aten.mul.Tensor, g, x, stream=0, name="x_grad")
    wg = b.op(aten.mm.default, g, x, stream=1, name="w_grad")
    return b.output(xg, wg)


def inputs(gm):
    torch.manual_seed(0)
    return [torch.randn(n.meta["val"].shape) for n in gm.graph.find_nodes(op="placeholder")]


# ---------------------------------------------------------------- (a) the last node on a side stream, returned

def test_correction_17_last_node_on_a_side_stream_is_joined():
    gm = weight_grad()
    assert unjoined(gm) == [(("output", "w_grad"), (0, 1), "w_grad")]
    msg = sanitize(gm, registry=reg()).errors[0].message
    assert "output returns w_grad" in msg and "on stream 1" in msg
    assert "record_event after w_grad on stream 1 and a wait_event for it on the current stream before output" in msg
    want = run_graph(gm, *inputs(gm))
    ours = weight_grad()
    r = passes(ours)
    assert sanitize(ours, registry=r).errors == []
    assert sanitize(ours, registry=r, reorder=True).errors == []
    got = run_graph(ours, *inputs(ours))
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_correction_17_upstream_keeps_the_seed_gap():
    seed = weight_grad()
    r = passes(seed, upstream=True)
    assert [e[0] for e in unjoined(seed, r)] == [("output", "w_grad")]
    only = weight_grad(); passes(only, upstream=True, only_syncs=True)
    assert syncs(only) == []                                   # the seed inserts nothing: w_grad has no consumer


def test_correction_17_exact_syncs():
    gm = weight_grad()
    passes(gm, only_syncs=True)
    assert syncs(gm) == [("record_event", (100, 1)), ("wait_event", (100, 0))]
    rec, wait = (gm.graph.find_nodes(op="call_function", target=t)[0] for t in (REC, WAIT))
    assert rec.prev.name == "w_grad" and wait.next.op == "output"
    assert rec.meta == wait.meta == {"partitioner_tag": "must_be_in_backward", "streamnb_pass": "insert_backward_syncs",
                                     "streamnb_correction": 17}   # (the correction that added them, for explain)
    assert CORRECTIONS[17].chapter == "11_syncs" and "syncs.CorrectedSyncs.output_producers" in CORRECTIONS[17].where


def test_correction_17_one_join_per_stream_in_producer_order():
    "Several outputs per side stream: one record after the last producer on each, streams in producer order."
    def graph(order):
        b = GraphBuilder(); g = b.input("tangents_1")
        a1 = b.op(aten.neg.default, g, stream=2)
        c1 = b.op(aten.sin.default, g, stream=1)
        a2 = b.op(aten.cos.default, g, stream=2)   # stream 2's last producer
        c2 = b.op(aten.relu.default, g, stream=1)  # stream 1's last producer: after cos
        outs = {"neg": a1, "sin": c1, "cos": a2, "relu": c2}
        return b.output(*(outs[k] for k in order))
    results = []
    for order in (["neg", "sin", "cos", "relu"], ["relu", "cos", "sin", "neg"]):
        gm = graph(order)
        passes(gm, only_syncs=True)
        recs = gm.graph.find_nodes(op="call_function", target=REC)
        results.append((syncs(gm), [r.prev.name for r in recs]))
        assert sanitize(gm, registry=reg()).errors == []
    assert results[0] == results[1]                            # the output order does not matter
    assert results[0] == ([("record_event", (100, 2)), ("record_event", (101, 1)),
                           ("wait_event", (100, 0)), ("wait_event", (101, 0))], ["cos", "relu"])


# ---------------------------------------------------------------- (b) a returned view of a side-stream tensor

def view_of_side():
    b = GraphBuilder(); g = b.input("tangents_1")
    m = b.op(aten.mul.Tensor, g, g, stream=1)
    return b.output(b.op(aten.t.default, m, stream=1))      # (a view on stream 0 would be a consumer the seed syncs)


def test_correction_17_returned_view_of_a_side_stream_tensor():
    gm = view_of_side()
    assert unjoined(gm) == [(("output", "mul"), (0, 1), "mul")]
    passes(gm, only_syncs=True)
    assert syncs(gm) == [("record_event", (100, 1)), ("wait_event", (100, 0))]
    assert gm.graph.find_nodes(op="call_function", target=REC)[0].prev.name == "mul"
    assert unjoined(gm) == []
    seed = view_of_side(); passes(seed, upstream=True)
    assert [e[0] for e in unjoined(seed)] == [("output", "mul")]


# ---------------------------------------------------------------- (c) an in-place write on a side stream

def inplace_on_side():
    "`clone` (current stream) is returned, but last written in place by `add_` on stream 1: the join follows `add_`."
    b = GraphBuilder(); g = b.input("tangents_1")
    c = b.op(aten.clone.default, g, stream=0)
    s = b.op(aten.sin.default, g, stream=1)
    w = b.op(aten.add_.Tensor, c, s, stream=1)
    b.op(aten.neg.default, g, stream=1)                        # later work on stream 1 that nothing returns
    return b.output(c)


def test_correction_17_inplace_write_on_a_side_stream():
    gm = inplace_on_side()
    assert unjoined(gm) == [(("output", "add_"), (0, 1), "clone")]
    want = run_graph(gm, *inputs(gm))
    passes(gm, only_syncs=True)
    recs = gm.graph.find_nodes(op="call_function", target=REC)
    joins = [r for r in recs if r.args[1] == 1 and any(w.args == (r.args[0], 0) and w.next.op == "output"
                                                       for w in gm.graph.find_nodes(op="call_function", target=WAIT))]
    assert [r.prev.name for r in joins] == ["add_"]           # after the last writer, not after clone nor neg
    assert sanitize(gm, registry=reg()).errors == []
    ours = inplace_on_side(); passes(ours)
    assert sanitize(ours, registry=reg()).errors == [] and sanitize(ours, registry=reg(), reorder=True).errors == []
    assert all(torch.equal(a, b) for a, b in zip(run_graph(ours, *inputs(ours)), want))


def test_forward_outputs_and_untouched_inputs_are_not_joined():
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward"); g = b.input("tangents_1")
    f = b.op(aten.relu.default, x, stream=1, tag="is_forward")    # a forward value saved for backward
    n = b.op(aten.neg.default, g, stream=0)
    gm = b.output(f, n, g)
    passes(gm, only_syncs=True)
    assert syncs(gm) == []                                    # the backward pass does not join the forward's values
    assert unjoined(gm) == [(("output", "relu"), (0, 1), "relu")]   # (the judge still sees it: the forward's job)


# ---------------------------------------------------------------- (d) no false positive

@pytest.mark.parametrize("how", ["wait_event", "wait_stream", "synchronize_stream", "consumer_on_current"])
def test_joined_output_is_not_reported(how):
    b = GraphBuilder(); g = b.input("tangents_1")
    m = b.op(aten.mul.Tensor, g, g, stream=1)
    if how == "wait_event": b.sync(REC, 10, 1); b.sync(WAIT, 10, 0)
    if how == "wait_stream": b.sync(streams.wait_stream.default, 0, 1)
    if how == "synchronize_stream": b.sync(streams.synchronize_stream.default, 1)
    if how == "consumer_on_current": b.op(aten.neg.default, m, stream=0)   # the pass's own pair for neg joins mul
    gm = b.output(m)
    if how != "consumer_on_current": assert sanitize(gm, registry=reg()).errors == []
    before = syncs(gm)
    passes(gm, only_syncs=True)
    if how == "consumer_on_current":                           # one pair, for the edge; no second one for the output
        assert syncs(gm) == [("record_event", (100, 1)), ("wait_event", (100, 0))]
        assert gm.graph.find_nodes(op="output")[0].prev.target is aten.neg.default
    else: assert syncs(gm) == before                           # already joined: the pass adds nothing
    assert sanitize(gm, registry=reg()).errors == []


def test_wait_on_the_wrong_stream_or_before_the_write_is_reported():
    for wait_stream, record_first in ((2, False), (0, True)):
        b = GraphBuilder(); g = b.input("tangents_1")
        if record_first: b.sync(REC, 10, 1)
        m = b.op(aten.mul.Tensor, g, g, stream=1)
        if not record_first: b.sync(REC, 10, 1)
        b.sync(WAIT, 10, wait_stream)
        assert unjoined(b.output(m)) == [(("output", "mul"), (0, 1), "mul")]


def test_current_stream_value_and_returned_input_are_fine():
    b = GraphBuilder(); g = b.input("tangents_1")
    b.op(aten.mul.Tensor, g, g, stream=1)
    n = b.op(aten.neg.default, g)                              # unannotated: the current stream
    assert sanitize(b.output(n, g), registry=reg()).errors == []


# ---------------------------------------------------------------- (e) generated graphs

@pytest.mark.parametrize("seed", range(40))
def test_generated_graphs_have_no_unjoined_output_after_the_default_passes(seed):
    kw = dict(n_nodes=20, p_fanout=0.2, p_unannotated=0.2, p_user_sync=0.1, p_copy=0.3)
    gm = graphgen.random_backward_graph(seed, **kw)
    r = passes(gm)
    assert unjoined(gm, r) == [], str(sanitize(gm, registry=r))
    assert unjoined(gm, r, reorder=True) == []


@pytest.mark.parametrize("seed", range(20))
def test_generated_alias_graphs_have_no_unjoined_output_after_the_default_passes(seed):
    gm = graphgen.random_alias_graph(seed)
    r = passes(gm)
    assert unjoined(gm, r) == [], str(sanitize(gm, registry=r))


def test_generated_graphs_are_not_vacuous():
    "The seed leaves some of the same graphs with an unjoined output, and the default joins each with few syncs."
    kw = dict(n_nodes=20, p_fanout=0.2, p_unannotated=0.2, p_user_sync=0.1, p_copy=0.3)
    seed_bad = 0
    for seed in range(40):
        gm = graphgen.random_backward_graph(seed, **kw)
        seed_bad += bool(unjoined(gm, passes(gm, upstream=True)))
        ours = graphgen.random_backward_graph(seed, **kw)
        passes(ours, only_syncs=True)
        out = ours.graph.find_nodes(op="output")[0]
        final_waits, n = [], out.prev
        while n.op == "call_function" and n.target is WAIT: final_waits.append(n); n = n.prev
        assert len(final_waits) <= 4                           # at most one join per side stream (streams 0..3)
    assert seed_bad >= 10
