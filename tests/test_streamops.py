"""The one decoding of stream ops (`streamops.decode`) and the one current-stream mapping: every op bare and wrapped in
control_deps, unknown ops refused, and every consumer (simulator, sanitizer, CUDA executor, CPU capture) covering
every row of the table."""
import pytest
import torch
from torch._inductor.fx_passes.control_dependencies import _create_subgraph_for_node, control_deps

from streamnb import streamops
from streamnb.graph import STREAM_OPS, GraphBuilder, StreamnbError, StreamRegistry, aten, streams
from streamnb.streamops import OPS, current_stream_key, decode, physical_stream

# op -> (args after the tensor is built, expected (kind, event, streams, is-tensor-arg))
CASES = {
    streams.record_event.default: (lambda y: (7, 1), ("record_event", 7, (1,), False)),
    streams.wait_event.default: (lambda y: (7, 0), ("wait_event", 7, (0,), False)),
    streams.sync_dealloc.default: (lambda y: (7, 0, y), ("sync_dealloc", 7, (0,), True)),
    streams.record_stream.default: (lambda y: (y, 2), ("record_stream", None, (2,), True)),
    streams.wait_stream.default: (lambda y: (0, 1), ("wait_stream", None, (0, 1), False)),
    streams.synchronize_event.default: (lambda y: (7,), ("synchronize_event", 7, (), False)),
    streams.synchronize_stream.default: (lambda y: (1,), ("synchronize_stream", None, (1,), False)),
    streams.synchronize_device.default: (lambda y: ("cuda", 0), ("synchronize_device", None, (), False)),
}


def one_op(op, wrap):
    b = GraphBuilder(); x = b.input("x")
    y = b.op(aten.mul.Tensor, x, 2.0, stream=1)
    s = b.sync(op, *CASES[op][0](y))
    gm = b.output(y)
    if wrap:   # as the wrapping pass does: the op in a subgraph, its node operands passed to control_deps
        g = gm.graph
        gm.sub = _create_subgraph_for_node(g, s, [])
        with g.inserting_before(s):
            s2 = g.call_function(control_deps, ((y,), g.get_attr("sub"), *s.all_input_nodes))
        g.erase_node(s); gm.recompile(); s = s2
    return gm, y, s


def test_table_covers_the_stream_ops():
    assert set(OPS) == set(STREAM_OPS) == set(CASES)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("op", list(CASES), ids=lambda o: o.__name__)
def test_decode_every_op(op, wrap):
    gm, y, s = one_op(op, wrap)
    d = decode(s, gm)
    kind, event, strs, has_tensor = CASES[op][1]
    assert (d.kind, d.event, d.streams, d.target, d.node) == (kind, event, strs, op, s)
    assert d.tensor is (y if has_tensor else None)   # wrapped: the outer operand, not the subgraph's placeholder
    assert d.stream == (strs[0] if strs else None)
    assert d.host == kind.startswith("synchronize")
    assert decode(y) is None and decode(next(iter(gm.graph.nodes))) is None


def test_unknown_stream_op_is_refused(monkeypatch):
    gm, y, s = one_op(streams.wait_stream.default, False)
    monkeypatch.delitem(OPS, streams.wait_stream.default)
    with pytest.raises(StreamnbError, match=s.name):
        decode(s)


def test_every_consumer_handles_every_kind():
    from streamnb.simulate import _ON_SYNC
    from streamnb.cuda import StreamInterpreter
    from streamnb.sanitizer import sanitize
    kinds = {spec.kind for spec in OPS.values()}
    assert set(_ON_SYNC) == kinds
    assert all(hasattr(StreamInterpreter, m) for m in StreamInterpreter.HANDLERS.values())
    assert set(StreamInterpreter.HANDLERS) == set(OPS)
    for op in CASES:   # the sanitizer and the simulator accept each op, bare and wrapped
        for wrap in (False, True):
            gm, _, _ = one_op(op, wrap)
            sanitize(gm, registry=StreamRegistry(current_stream=0))


def test_cpu_capture_skips_every_op():
    from streamnb.capture import run_graph
    for op in CASES:
        for wrap in (False, True):
            gm, _, _ = one_op(op, wrap)
            x = torch.randn(4, 4)
            (out,) = run_graph(gm, x)
            torch.testing.assert_close(out, x * 2)


def test_current_stream_mapping():
    r = StreamRegistry(start=10)
    assert current_stream_key(r) == 0 and physical_stream(None, r) == 0
    cur, cur2 = r.get_current_stream("cuda"), r.get_current_stream("cuda")
    assert [physical_stream(i, r) for i in (None, cur, cur2, 3)] == [cur, cur, cur, 3]
    pinned = StreamRegistry(start=10, current_stream=5)
    assert [physical_stream(i, pinned) for i in (None, 5, 1)] == [5, 5, 1]


def test_simulator_and_sanitizer_agree_on_the_current_stream():
    "An unannotated producer read on the registry's current-stream index: one stream for both, no race, no wait."
    from streamnb.sanitizer import sanitize
    from streamnb.simulate import simulate
    r = StreamRegistry(start=10); cur = r.get_current_stream("cuda")
    b = GraphBuilder(); x = b.input("x")
    m = b.op(aten.mul.Tensor, x, x)                     # None: the current stream
    a = b.op(aten.add.Tensor, m, x, stream=cur)         # the same stream by another index
    gm = b.output(a)
    assert sanitize(gm, registry=r).ok
    tl = simulate(gm, cost={"mul": 1.0, "add": 1.0}, registry=r)
    assert tl.streams == [cur] and tl.makespan == 2.0 and tl.unordered_reads == []


def test_streamops_imports_only_graph():
    import ast, inspect
    mods = {n.module for n in ast.walk(ast.parse(inspect.getsource(streamops))) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in mods if m and m.lstrip(".").split(".")[0] not in ("__future__", "dataclasses", "typing", "torch", "graph")}
    assert streamops.__all__ == [n for n in streamops.__all__ if not n.startswith("_")]


def test_vector_clocks():
    "record snapshots (a later launch is not in the snapshot), wait joins, wait_stream joins, host syncs reach every stream."
    from types import SimpleNamespace as K
    from streamnb.streamops import VectorClocks
    vc = VectorClocks()
    a = vc.launch(1); vc.record("e", 1); b = vc.launch(1)
    assert vc.wait("e", 0)
    assert vc.ordered(K(seq=a, stream=1), 0) and not vc.ordered(K(seq=b, stream=1), 0)
    assert not vc.wait("f", 0)                                 # never recorded: orders nothing
    vc.wait_stream(0, 1); assert vc.ordered(K(seq=b, stream=1), 0)
    c = vc.launch(2)
    assert not vc.ordered(K(seq=c, stream=2), 3)
    vc.sync_stream(2)                                           # the host waited for stream 2 ...
    assert vc.ordered(K(seq=c, stream=2), 3) and vc.ordered(K(seq=c, stream=2), 0)   # ... so every stream is after it
    d = vc.launch(4); vc.record("g", 4); vc.sync_event("g")
    assert vc.ordered(K(seq=d, stream=4), 1)
