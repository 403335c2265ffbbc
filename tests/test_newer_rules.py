"""Issue 47: newer PyTorch's ordering rules for the syncs a program writes itself (corrections 26 to 28).

Each test replays a test of PyTorch main's `test/dynamo/test_streams.py` (named in its docstring) on a `GraphBuilder`
graph, on a CPU: what that test asserts about the graph where it is stable, the order along data edges (the sanitizer
with `reorder=True` finds nothing in the default's output), and, where the seed differs, the seed's failure
(`upstream=True`, marked xfail strict)."""
import operator

import pytest
import torch

from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps as wrap
from streamnb.graph import GraphBuilder, StreamRegistry, is_control_deps, use_registry
from streamnb.sanitizer import sanitize
from test_control_deps import ancestors   # (one definition, chapter 13's tests)

aten, streams = torch.ops.aten, torch.ops.streams
REC, WAIT, SYNC_E = streams.record_event.default, streams.wait_event.default, streams.synchronize_event.default
SYNC_S, SYNC_D, WAIT_S = streams.synchronize_stream.default, streams.synchronize_device.default, streams.wait_stream.default
SEED_FAILS = pytest.param(True, marks=pytest.mark.xfail(strict=True, reason="the seed's defect"), id="upstream")


def ctrls(gm):
    return [n for n in gm.graph.nodes if is_control_deps(n)]


def inner(gm, ctrl):
    "The sync op inside a control_deps node's subgraph."
    return next(n for n in getattr(gm, ctrl.args[1].target).graph.nodes if n.op == "call_function")


def ctrls_of(gm, target):
    return [c for c in ctrls(gm) if inner(gm, c).target is target]


def clean(gm, current=0):
    """No hazard along the data edges: the sanitizer with reordering finds nothing that program order does not have
    (stream `current` is the current one; PyTorch's programs leave some blocks unprotected, which is not ours to judge)."""
    reg = StreamRegistry(current_stream=current)
    assert sanitize(gm, reorder=True, registry=reg).errors == sanitize(gm, registry=reg).errors
    gm.graph.lint()


def wrapped(gm, upstream=False, current=0):
    with use_registry(StreamRegistry(current_stream=current)):
        wrap(gm, upstream=upstream)
    return gm


# ---------------------------------------------------------------------------------------------------------------
# Item 1: every sync is an anchor (correction 26)
# ---------------------------------------------------------------------------------------------------------------

EMPTY_SYNCS = {"synchronize_stream": (SYNC_S, 0), "synchronize_device": (SYNC_D, "cuda", 0),
               "wait_stream": (WAIT_S, 1, 0), "wait_event": (WAIT, 0, 1), "synchronize_event": (SYNC_E, 0)}


@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
@pytest.mark.parametrize("sync", list(EMPTY_SYNCS))
def test_correction_26_an_empty_sync_anchors_the_next_record(sync, upstream):
    """PyTorch's test_empty_{synchronize_stream,synchronize_device,wait_stream,synchronize_event}_anchors_record and
    test_external_wait_event_anchors_record: a sync with nothing before it, then `record_event(2, 1)`; the record is
    wrapped with the sync (its node, or its `control_deps`) as a dependency. (The seed wraps the external wait and the
    external `synchronize_event` too, but leaves the record after the others bare.)"""
    b = GraphBuilder()
    inp = b.input("inp", tag=None)
    b.sync(*EMPTY_SYNCS[sync])
    b.sync(REC, 2, 1)
    gm = wrapped(b.output(inp), upstream)
    (rec,) = ctrls_of(gm, REC)
    anchor = next(n for n in gm.graph.nodes if n.op == "call_function" and n is not rec
                  and (is_control_deps(n) and inner(gm, n).target is not REC or n.target is EMPTY_SYNCS[sync][0]))
    assert anchor in rec.args[0]
    gm.graph.lint()


@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
def test_correction_26_synchronize_event_follows_a_bare_record(upstream):
    """PyTorch's test_event_synchronize_tracing: `record_event(1, 0)` with nothing before it, `add`, then
    `synchronize_event(1)`: the synchronize is wrapped with the record and `add` as dependencies (PyTorch's graph:
    `control_deps((record_event, add), subgraph_synchronize_event)`)."""
    b = GraphBuilder()
    x = b.input("arg0_1", tag=None)
    rec = b.sync(REC, 1, 0)
    add = b.op(aten.add.Tensor, x, x, stream=0, tag=None)
    b.sync(SYNC_E, 1)
    gm = wrapped(b.output(add), upstream)
    (sync,) = ctrls(gm)
    assert list(sync.args[0]) == [rec, add]
    clean(gm)


def test_correction_26_wait_stream_anchors_the_following_record():
    """PyTorch's test_wait_stream_anchors_following_record: `a = x @ x`, `ready.record(default)`, then on `side`:
    `side.wait_stream(default)` and `e.record()`; `e.wait()` on the default stream. The wait_stream follows the first
    record; the record on the waiting stream follows the wait_stream; no record is left bare."""
    b = GraphBuilder()
    x = b.input("x", tag=None)
    a = b.op(aten.mm.default, x, x, stream=0, tag=None)
    b.sync(REC, 7, 0)
    b.sync(WAIT_S, 1, 0)
    b.sync(REC, 8, 1)
    b.sync(WAIT, 8, 0)
    gm = wrapped(b.output(a))
    assert gm.graph.find_nodes(op="call_function", target=REC) == []
    r1, r2 = ctrls_of(gm, REC)
    (ws,) = ctrls_of(gm, WAIT_S)
    assert r1 in ws.args[0] and ws in r2.args[0]
    clean(gm)


def test_correction_26_same_stream_records_form_a_chain():
    "PyTorch's test_same_stream_record_ordering: three records on one stream after `a = x + 1`, each after the last."
    b = GraphBuilder()
    x = b.input("x", tag=None)
    a = b.op(aten.add.Tensor, x, x, stream=1, tag=None)
    for e in (2, 3, 4): b.sync(REC, e, 1)
    gm = wrapped(b.output(a))
    r1, r2, r3 = ctrls(gm)
    assert r1 in r2.args[0] and r2 in r3.args[0] and r1 not in r3.args[0]
    gm.graph.lint()


def test_correction_26_leading_synchronize_stream_orders_following_work():
    "PyTorch's test_leading_synchronize_stream_orders_following_work: `synchronize()` first, then `x + 1` reads through it."
    b = GraphBuilder()
    x = b.input("x", tag=None)
    b.sync(SYNC_S, 0)
    add = b.op(aten.add.Tensor, x, x, stream=0, tag=None)
    gm = wrapped(b.output(add))
    (sync,) = ctrls(gm)
    assert add.args[0].args[0] is sync
    clean(gm)


def test_correction_26_anchors_in_the_backward():
    """The same rule in a joint graph's backward: the forward records `fw`; the backward's host barrier has nothing of
    the backward before it (correction 7 drops the forward's record), so it stays bare, and the backward's record after
    it is wrapped with it as a dependency."""
    b = GraphBuilder()
    x, t = b.input("x", tag="is_forward"), b.input("tangents_1")
    fw = b.op(aten.mul.Tensor, x, x, stream=1, tag="is_forward")
    b.sync(REC, 3, 1, tag="is_forward")
    barrier = b.sync(SYNC_S, 1, tag="is_backward")
    b.sync(REC, 4, 1, tag="is_backward")
    gm = wrapped(b.output(fw, t))
    fw_rec, bw_rec = ctrls_of(gm, REC)
    assert list(bw_rec.args[0]) == [barrier] and fw_rec not in ancestors(bw_rec)


# ---------------------------------------------------------------------------------------------------------------
# Item 2: waits thread the value they order
# ---------------------------------------------------------------------------------------------------------------

def multiple_waiters(backward=False, cur=0):
    """PyTorch's test_control_deps_multiple_waiters_thread_latest_passthrough: `y = x + 1` on the current stream (0),
    `fork` (event 3) recorded; streams 1 and 2 each wait on it and read `y`, then record `join1`/`join2` (events 4, 5);
    stream 0 waits on both and adds the two results. `backward`: the same in a backward graph."""
    tag = "is_backward" if backward else None
    b = GraphBuilder()
    x = b.input("tangents_1" if backward else "x", tag=tag)
    y = b.op(aten.add.Tensor, x, x, stream=cur, tag=tag)
    b.sync(REC, 3, 0, tag=tag)
    b.sync(WAIT, 3, 1, tag=tag)
    out1 = b.op(aten.mul.Tensor, y, y, stream=1, tag=tag)
    b.sync(REC, 4, 1, tag=tag)
    b.sync(WAIT, 3, 2, tag=tag)
    out2 = b.op(aten.mul.Tensor, y, y, stream=2, tag=tag)
    b.sync(REC, 5, 2, tag=tag)
    b.sync(WAIT, 4, 0, tag=tag)
    b.sync(WAIT, 5, 0, tag=tag)
    return b.output(b.op(aten.add.Tensor, out1, out2, stream=cur, tag=tag))


@pytest.mark.parametrize("cur", [0, None], ids=["annotated", "unannotated"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
def test_correction_6_multiple_waiters_thread_the_latest_passthrough(upstream, backward, cur):
    """Each consumer reads `y` through its own wait on the fork: the second wait threads the first wait's passthrough
    (PyTorch #193409), so `out2` reads a getitem of the second fork wait."""
    gm = wrapped(multiple_waiters(backward, cur), upstream)
    fork_waits = [c for c in ctrls_of(gm, WAIT) if inner(gm, c).args[0] == 3]
    out1, out2 = gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)
    assert len(fork_waits) == 2
    assert out1.args[0].target is operator.getitem and out1.args[0].args[0] is fork_waits[0]
    assert out2.args[0].target is operator.getitem and out2.args[0].args[0] is fork_waits[1]
    clean(gm)


def intervening_sync(kind, backward=False, cur=0):
    """PyTorch's test_intervening_sync_updates_event_passthrough: `y = x + 1` on stream 0, `fork` (event 3) recorded;
    then stream 1 joins stream 0 (`wait_stream`), or the host synchronizes stream 0 and stream 1 records event 4; then
    stream 2 waits on `fork` and reads `y`."""
    tag = "is_backward" if backward else None
    b = GraphBuilder()
    x = b.input("tangents_1" if backward else "x", tag=tag)
    y = b.op(aten.add.Tensor, x, x, stream=cur, tag=tag)
    b.sync(REC, 3, 0, tag=tag)
    if kind == "wait_stream":
        b.sync(WAIT_S, 1, 0, tag=tag)
    else:
        b.sync(SYNC_S, 0, tag=tag)
        b.sync(REC, 4, 1, tag=tag)
    b.sync(WAIT, 3, 2, tag=tag)
    return b.output(b.op(aten.mul.Tensor, y, y, stream=2, tag=tag))


@pytest.mark.parametrize("cur", [0, None], ids=["annotated", "unannotated"])
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("kind", ["wait_stream", "full_barrier"])
def test_intervening_sync_updates_event_passthrough(kind, backward, cur):
    "The consumer reads `y` through the wait on `fork`: the sync in between does not cut the edge."
    gm = wrapped(intervening_sync(kind, backward, cur))
    (wait,) = ctrls_of(gm, WAIT)
    (mul,) = gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)
    assert mul.args[0].target is operator.getitem and mul.args[0].args[0] is wait
    clean(gm)


# ---------------------------------------------------------------------------------------------------------------
# Item 4: a dict-valued node is never passed through control_deps (correction 27)
# ---------------------------------------------------------------------------------------------------------------

def triton_then_record():
    """PyTorch's test_expand_dict_returning_deps_triton_kernel, as a graph: `triton_kernel_wrapper_functional` (a dict
    `{"Out": ...}`), a `record_event(1, 0)`, then the kernel's `getitem(..., "Out")` and `add` after the record."""
    from torch._higher_order_ops.triton_kernel_wrap import triton_kernel_wrapper_functional
    b = GraphBuilder()
    x = b.input("x", tag=None)
    kernel = b.op(triton_kernel_wrapper_functional, tag=None, name="triton_kernel_wrapper_functional",
                  val={"Out": torch.empty(4, 4, device="meta")}, kernel_idx=0, constant_args_idx=0, grid=[(1, 1, 1)],
                  tma_descriptor_metadata={}, kwargs={"Out": x}, tensors_to_clone=["Out"])
    b.sync(REC, 1, 0)
    out = b.op(operator.getitem, kernel, "Out", tag=None)
    return b.output(b.op(aten.add.Tensor, out, x, tag=None))


@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
def test_correction_27_a_dict_is_never_passed_through_a_sync(upstream):
    "The kernel's getitem is made before the record and passed through instead of the dict; the old getitem is gone."
    gm = wrapped(triton_then_record(), upstream)
    (rec,) = ctrls(gm)
    kernel = next(n for n in gm.graph.nodes if n.name == "triton_kernel_wrapper_functional")
    assert kernel not in rec.args[0] and kernel not in rec.args[2:]
    (new,) = rec.args[2:]
    order = list(gm.graph.nodes)
    assert new.target is operator.getitem and new.args == (kernel, "Out") and order.index(new) < order.index(rec)
    assert [u for u in kernel.users] == [new]                      # the getitem after the sync was replaced
    (add,) = gm.graph.find_nodes(op="call_function", target=aten.add.Tensor)
    assert add.args[0].target is operator.getitem and add.args[0].args[0] is rec
    clean(gm)


# ---------------------------------------------------------------------------------------------------------------
# Item 3: partitions (corrections 7 and 26)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("forward_sync", ["wrapped", "bare"])
@pytest.mark.parametrize("upstream", [False, SEED_FAILS])
def test_correction_26_backward_full_barrier_filters_forward_sync_deps(upstream, forward_sync):
    """PyTorch's test_backward_full_barrier_filters_forward_sync_deps: a forward sync (a record after `fw_compute`, or a
    `wait_stream` of two idle streams, left bare), then a backward `record_event(4, 0)` and a backward host barrier. The barrier depends
    on the backward sync (the seed leaves both bare), never on the forward one."""
    b = GraphBuilder()
    inp = b.input("inp", tag="is_forward")
    fw_compute = b.op(aten.add.Tensor, inp, inp, stream=0, tag="is_forward")
    fw_sync = b.sync(REC, 3, 0, tag="is_forward") if forward_sync == "wrapped" else b.sync(WAIT_S, 1, 2, tag="is_forward")
    bw_sync = b.sync(REC, 4, 0, tag="is_backward")
    barrier = b.sync(SYNC_D, "cuda", 0, tag="is_backward")
    gm = wrapped(b.output(fw_compute), upstream)
    (bw_ctrl,) = [c for c in ctrls(gm) if inner(gm, c).target is SYNC_D]
    fw = ctrls_of(gm, REC)[0] if forward_sync == "wrapped" else fw_sync
    assert forward_sync == "wrapped" or fw_sync in gm.graph.nodes    # (bare)
    assert list(bw_ctrl.args[0]) == [bw_sync] and fw not in ancestors(bw_ctrl)
    assert barrier not in gm.graph.nodes                       # (wrapped: the node now lives in the subgraph)


def test_custom_backward_wait_stays_in_backward():
    """PyTorch's test_custom_backward_wait_stays_in_backward, captured on this CPU: a custom autograd.Function whose
    backward calls `current_stream().wait_stream(stream)` before `grad * saved`. After the passes and the partitioner
    the forward has no `wait_stream`; the backward has one, wrapped, after the tangent only (not the saved forward
    value, correction 7), and the sanitizer with reordering finds nothing there."""
    from streamnb.capturing import capture, cpu_streams
    with cpu_streams():
        stream = torch.cuda.Stream()

    class WaitInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, saved):
            ctx.save_for_backward(saved)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            (saved,) = ctx.saved_tensors
            torch.cuda.current_stream().wait_stream(stream)
            return grad * saved, None

    def waits(gm):
        return [n for n in gm.graph.nodes if n.target is WAIT_S
                or is_control_deps(n) and inner(gm, n).target is WAIT_S]

    cap = capture(WaitInBackward.apply, torch.ones(8, requires_grad=True), torch.ones(8))
    p = cap.process()
    assert waits(p.forward) == []
    (wait,) = waits(p.backward)
    assert is_control_deps(wait) and [d.name for d in wait.args[0]] == ["tangents_1"]
    clean(p.backward, cap.current_stream)


def _captured(kind):
    "PyTorch's programs of the item-2 tests, as written there (CUDA objects, stood in for by `cpu_streams`)."
    from streamnb.capturing import cpu_streams
    with cpu_streams():
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        fork, e1, e2 = torch.cuda.Event(), torch.cuda.Event(), torch.cuda.Event()

    def multiple_waiters(x):
        default_stream = torch.cuda.current_stream()
        y = x + 1
        fork.record(default_stream)
        with torch.cuda.stream(s1):
            fork.wait()
            out1 = y * 2
            e1.record()
        with torch.cuda.stream(s2):
            fork.wait()
            out2 = y * 3
            e2.record()
        default_stream.wait_event(e1)
        default_stream.wait_event(e2)
        return out1 + out2

    def intervening(x):
        default_stream = torch.cuda.current_stream()
        y = x + 1
        fork.record(default_stream)
        if kind == "wait_stream":
            s1.wait_stream(default_stream)
        else:
            default_stream.synchronize()
            e1.record(s1)
        with torch.cuda.stream(s2):
            fork.wait()
            out = y * 2
        default_stream.wait_stream(s2)
        return out
    return multiple_waiters if kind == "multiple_waiters" else intervening


@pytest.mark.parametrize("kind", ["multiple_waiters", "wait_stream", "full_barrier"])
def test_item_2_captured_programs_read_through_their_waits(kind):
    """The programs of test_control_deps_multiple_waiters_thread_latest_passthrough and
    test_intervening_sync_updates_event_passthrough[wait_stream|full_barrier], captured on this CPU and run through the
    passes: every `mul` reads `y` through a getitem of the wait on `fork` on its own stream, the sanitizer with
    reordering finds nothing in the default's joint graph, and it does in the seed's."""
    from streamnb.capturing import capture, eager
    fn = _captured(kind)
    x = torch.ones(2, 2, requires_grad=True)
    cap = capture(fn, x)
    default, seed = cap.process(), cap.process(upstream=True)
    fw = default.forward   # (the backward's muls are annotated too, by chapter 10's pass)
    fork_waits = [c for c in ctrls_of(fw, WAIT) if inner(fw, c).args[0] == 1]
    muls = [n for n in fw.graph.nodes if n.target is aten.mul.Tensor]
    assert len(muls) == len(fork_waits) == (2 if kind == "multiple_waiters" else 1)
    for mul, wait in zip(muls, fork_waits):
        assert mul.args[0].target is operator.getitem and mul.args[0].args[0] is wait
    clean(default.joint, cap.current_stream)
    reg = StreamRegistry(current_stream=cap.current_stream)
    assert "reorderable" in sanitize(seed.joint, reorder=True, registry=reg).kinds
    torch.testing.assert_close(default.run(x).outputs, eager(fn, x).outputs)


# ---------------------------------------------------------------------------------------------------------------
# Item 5: input write-backs and barriers (corrections 13 and 19, chapter 10)
# ---------------------------------------------------------------------------------------------------------------

def mutate_then_barrier(barrier, mutation_stream=1, backward=False):
    """What AOTAutograd hands over for PyTorch's test_input_mutation_writeback_precedes_barrier[barrier] (`with stream:
    x.add_(1)`, the barrier, `return y + 1`) and, with `mutation_stream=None`, for
    test_current_stream_alias_writeback_precedes_wait_stream (`x.add_(1)` on the current stream, then
    `observer.wait_stream(current_stream)`): the write-back `copy_(x, add)` at the graph's end. `backward`: the same
    in a joint graph's backward (test_backward_input_writeback_before_wait_stream_errors's custom backward)."""
    tag = "is_backward" if backward else None
    b = GraphBuilder(device="cpu")
    x, y = b.input("arg0_1", tag=None), b.input("tangents_1" if backward else "arg1_1", tag=tag)
    add = b.op(aten.add.Tensor, x, 1, stream=mutation_stream, tag=tag)
    s = mutation_stream
    if barrier == "wait_stream": b.sync(WAIT_S, 2 if s is None else 0, 0 if s is None else s, tag=tag)
    elif barrier == "synchronize_stream": b.sync(SYNC_S, s, tag=tag)
    elif barrier == "synchronize_device": b.sync(SYNC_D, "cuda", 0, tag=tag)
    else: b.sync(REC, 9, s, tag=tag); b.sync(WAIT, 9, 0, tag=tag)
    out = b.op(aten.add.Tensor, y, 1, tag=tag)
    b.op(aten.copy_.default, x, add, tag="must_be_in_backward" if backward else None)
    return b.output(out)


def _passes(gm, upstream=False):
    from streamnb.pipeline import run_stream_passes
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm, upstream=upstream)
    return gm


BARRIERS = {"wait_stream": WAIT_S, "synchronize_stream": SYNC_S, "synchronize_device": SYNC_D, "wait_event": REC}


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed leaves the write-back after the barrier"), id="upstream")])
@pytest.mark.parametrize("barrier", list(BARRIERS))
def test_correction_13_input_mutation_writeback_precedes_barrier(barrier, upstream):
    """The write-back `copy_` is a dep of the barrier (PyTorch's `assert_writeback_precedes_barrier`; for
    `wait_event`, of the record of the event it waits for, where the event captures the stream's work), it comes
    before it in the code, the order holds along data edges, and the input holds the new value."""
    from streamnb.capturing import run_graph
    gm = _passes(mutate_then_barrier(barrier), upstream)
    (copy,) = gm.graph.find_nodes(op="call_function", target=aten.copy_.default)
    (bar,) = ctrls_of(gm, BARRIERS[barrier])
    assert copy in bar.args[0] and copy.args[0].op == "placeholder"
    clean(gm)
    x, y = torch.zeros(4), torch.zeros(4)
    assert run_graph(gm, x, y)[0].tolist() == [1.0] * 4 and x.tolist() == [1.0] * 4


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed leaves the write-back after the barrier"), id="upstream")])
@pytest.mark.parametrize("graph", [
    # test_current_stream_alias_writeback_precedes_wait_stream[direct]: the mutation runs on the current stream
    # (unannotated), an observer stream joins it. (Its `argument` and `closure` cases pass the current stream as a
    # `torch.cuda.ExternalStream` alias of it; after dynamo the graph is this one, and on a CPU there is no such alias.)
    pytest.param(dict(mutation_stream=None), id="current_stream_alias"),
    # test_backward_input_writeback_before_wait_stream_errors: a custom backward mutates a saved input on a side
    # stream, then the current stream joins it. Newer PyTorch refuses it ('backward input mutation cannot be ordered').
    # On torch 2.13 AOTAutograd writes the input back inside the backward graph (a `copy_` at its end, as PyTorch's
    # test_epilogue_copy_stream_tracking shows), so the default orders it instead: the `copy_` moves before the join
    # (correction 13), the join depends on it, and the input holds the new value: a refusal would refuse a right program.
    pytest.param(dict(backward=True), id="backward_input")])
def test_correction_13_writeback_precedes_wait_stream(graph, upstream):
    "The write-back of a mutated input is ordered before a `wait_stream` that joins the mutation's stream."
    from streamnb.capturing import run_graph
    gm = _passes(mutate_then_barrier("wait_stream", **graph), upstream)
    (copy,) = gm.graph.find_nodes(op="call_function", target=aten.copy_.default)
    (bar,) = ctrls_of(gm, WAIT_S)
    assert copy in bar.args[0]
    clean(gm)
    x = torch.zeros(4)
    run_graph(gm, x, torch.zeros(4))
    assert x.tolist() == [1.0] * 4


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed compiles it silently"), id="upstream")])
def test_correction_19_out_of_graph_input_writeback_before_wait_stream_errors(upstream):
    """test_out_of_graph_input_writeback_before_wait_stream_errors: `x` requires grad, so AOTAutograd returns its new
    value and the runtime wrapper writes it back after the call; `x.add_(1)` runs on the current stream and an
    observer stream joins it inside the graph. No write-back can be ordered before that join: refused, saying what to
    move (the same rule as test_compile_corrections' side-stream case, end to end)."""
    import types
    from streamnb.assign import UnorderableWriteBackError
    from streamnb.metadata import populate_fw_metadata_with_stream_indices
    b = GraphBuilder()
    x, y = b.input("primals_1", tag=None), b.input("primals_2", tag=None)
    add = b.op(aten.add.Tensor, x, 1, tag=None)
    b.sync(WAIT_S, 2, 0)
    gm = b.output(add, b.op(aten.add.Tensor, y, 1, tag=None))
    meta = types.SimpleNamespace(input_info=[types.SimpleNamespace(mutates_data=True),
                                             types.SimpleNamespace(mutates_data=False)], mutated_inp_runtime_indices=[0],
                                 num_mutated_inp_runtime_indices=1)
    with use_registry(StreamRegistry(current_stream=0)):
        with pytest.raises(UnorderableWriteBackError, match="Move the barrier after the compiled function call"):
            populate_fw_metadata_with_stream_indices(gm, meta, upstream=upstream)


def _aliases(layout):
    "Two inputs on one 16-element storage: (storage offset, size, stride) of `first` and of `second`."
    return {"interleaved": ((0, (8,), (2,)), (1, (8,), (2,))),           # even and odd elements
            "finite_sparse": ((0, (2, 2), (8, 2)), (1, (2, 2), (8, 2))),  # strided 2x2 views, interleaved
            "blocks": ((0, (2, 2), (8, 1)), (2, (2, 2), (8, 1))),         # two 2x2 blocks (torch 2.13 proves them apart)
            "overlapping": ((0, (8,), (2,)), (2, (8,), (2,)))}[layout]


def run_disjoint(layout, upstream=False):
    """PyTorch's test_disjoint_mutations_cross_barrier[layout]: `first.add_(1)` on a side stream, the current stream
    joins it (`wait_stream`), `second.add_(2)` on the side stream; compiled under the switch on this CPU (AOTAutograd
    keeps the mutations in the graph, as Inductor asks). (first, second, result, the graph after the passes)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from streamnb import use_streamnb_passes
    from streamnb.capturing import run_graph
    side, cur = torch.Stream(device="cpu"), torch.Stream(device="cpu")

    def fn(first, second, out):
        second = second.view_as(second)
        with side: first.add_(1)
        cur.wait_stream(side)
        with side: second.add_(2)
        return out + 1

    torch._dynamo.reset()
    storage = torch.zeros(16).untyped_storage()
    first, second = (torch.empty(0).set_(storage, o, size, stride) for o, size, stride in _aliases(layout))
    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(lambda *a: run_graph(gm, *a)),
                           keep_inference_input_mutations=True)
    with use_streamnb_passes(upstream=upstream, cpu_as="meta") as sw:
        result = torch.compile(fn, backend=backend)(first, second, torch.zeros(1))
    return first, second, result, sw.graphs[0]


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed leaves the one write-back after the join"), id="upstream")])
@pytest.mark.parametrize("layout", ["interleaved", "finite_sparse", "blocks"])
def test_correction_28_disjoint_mutations_cross_barrier(layout, upstream):
    """Where torch 2.13 cannot prove the two aliases apart (interleaved, finite_sparse) they are one synthetic base with
    one write-back; the mutations write disjoint elements, so the default moves the second mutation's making and the
    write-back above the join (before: refused, 'spans a stream barrier'). Where it can (blocks), each has its
    write-back, and `first`'s goes above the join (13). Either way: accepted, the join depends on the write-back of
    `first`'s new value, and eager's values."""
    first, second, result, gm = run_disjoint(layout, upstream)
    assert first.tolist() == torch.ones_like(first).tolist() and second.tolist() == torch.full_like(second, 2).tolist()
    assert result.tolist() == [1.0]
    copies = gm.graph.find_nodes(op="call_function", target=aten.copy_.default)
    assert len(copies) == (2 if layout == "blocks" else 1)
    (join,) = ctrls_of(gm, WAIT_S)
    assert copies[0] in join.args[0] and (layout != "blocks" or copies[1] not in ancestors(join))


def test_correction_28_overlapping_mutations_across_a_barrier_are_still_refused():
    "The same with overlapping aliases (offsets 0 and 2, stride 2): no order honours the join; refused (correction 19)."
    with pytest.raises(Exception, match="spans a stream barrier"):
        run_disjoint("overlapping")
