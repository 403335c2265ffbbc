import functools
"""One storage model for the simulator, the sanitizer and the dealloc pass, on graphs traced from `torch.split`,
`torch.chunk`, `torch.unbind`, views and in-place ops: they simulate (no KeyError), and the sanitizer and the simulator
agree on unsafe reuse with the aliases spread over two streams."""
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from streamnb.graph import StreamRegistry, use_registry
from streamnb.dealloc import sync_deallocations
from streamnb.sanitizer import sanitize
from streamnb.simulator import simulate
from streamnb.streamops import owner, storages

aten, streams = torch.ops.aten, torch.ops.streams

MODELS = {
    "split": lambda x: [p.sin() for p in torch.split(x * 2, 2)],
    "split_sizes": lambda x: [p.cos() for p in torch.split(x * 2, [1, 3])],
    "chunk": lambda x: [p.exp() for p in torch.chunk(x * 2, 2)],
    "unbind": lambda x: [p.neg() for p in torch.unbind(x * 2)],
    "view_inplace": lambda x: [(x * 2).t().add_(1.0).sin()],
}


def traced(name):
    gm = make_fx(MODELS[name], tracing_mode="fake")(torch.empty(4, 4, device="meta"))   # a device tensor (CPU ones never race)
    for n in gm.graph.nodes:
        if n.op != "output": n.meta["partitioner_tag"] = "is_backward"
    return gm


@pytest.mark.parametrize("name", list(MODELS))
def test_traced_graph_simulates_on_one_stream(name):
    gm = traced(name)
    tl = simulate(gm, cost=lambda n: 0.001)
    base = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    mem = storages(gm)
    assert all(owner(mem, u) is base for u in base.users if u.op == "call_function")   # views of mul's block
    assert tl.unsafe_frees == [] and tl.unordered_reads == [] and sanitize(gm).ok


def spread(gm, sync_data=True):
    "mul on stream 0; every node after it on stream 1, with a record/wait for mul's data."
    nodes = list(gm.graph.nodes)
    mul = next(n for n in nodes if n.target is aten.mul.Tensor)
    mul.meta["custom"] = {"stream": 0}
    for n in nodes[nodes.index(mul) + 1:]:
        if n.op == "call_function": n.meta["custom"] = {"stream": 1}
    if sync_data:
        with gm.graph.inserting_after(mul):
            w = gm.graph.call_function(streams.wait_event.default, (3,), {"stream_index": 1})   # keyword form
        with gm.graph.inserting_after(mul):
            gm.graph.call_function(streams.record_event, (3, 0))                               # packet form
    gm.recompile()
    return gm


@pytest.mark.parametrize("upstream", [False, True])
@pytest.mark.parametrize("name", list(MODELS))
def test_sanitizer_and_simulator_agree_across_streams(name, upstream):
    gm = spread(traced(name))
    reg = StreamRegistry(start=5, current_stream=2)
    # the inputs as if fenced (inputs_ready="everywhere"): mul on stream 0 reads x, made on the caller's stream 2 with
    # no wait; that edge is tests/test_edges.py's and test_entry_syncs.py's subject, not this file's
    san = functools.partial(sanitize, registry=reg, inputs_ready="everywhere")
    sim = functools.partial(simulate, registry=reg, cost=lambda n: 0.001, inputs_ready="everywhere")
    before = (san(gm), sim(gm))
    # Every output is made on stream 1 and read by the caller on the current stream (2) with nothing joining them: the
    # sanitizer says so (`unjoined_output`); the simulator does not model the caller, so compare the other kinds only.
    outs = [a.name for a in gm.graph.find_nodes(op="output")[0].args[0]]
    unjoined = lambda r: [(e.tensor, e.nodes, e.streams) for e in r.errors if e.kind == "unjoined_output"]
    joint = lambda r: [e for e in r.errors if e.kind != "unjoined_output"]
    assert unjoined(before[0]) == [(o, ("output", o), (2, 1)) for o in outs]
    assert [e.kind for e in joint(before[0])] == ["unsafe_reuse"] and [u.tensor for u in before[1].unsafe_frees] == ["mul"]
    with use_registry(reg):
        sync_deallocations(gm, upstream=upstream)
    rep, tl = san(gm), sim(gm)
    assert [e.tensor for e in joint(rep) if e.kind == "unsafe_reuse"] == [u.tensor for u in tl.unsafe_frees]
    assert not any(e.kind == "race" for e in rep.errors) and tl.unordered_reads == []
    assert unjoined(rep) == unjoined(before[0])   # the dealloc pass frees; joining the outputs is not its job
    if not upstream: assert joint(rep) == [], rep   # the default protects mul's block up to its last reader on stream 1
