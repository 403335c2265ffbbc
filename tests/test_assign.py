"""Tests for streamnb.assign: gradient-accumulation streams and epilogue-copy streams."""
import pytest

from streamnb.assign import assign_backward_streams, assign_epilogue_copy_streams
from streamnb.graph import (AlreadyProcessedWarning, GraphBuilder, MissingValError, StreamAnnotationError,
                            StreamRegistry, aten, canonical, get_stream, use_registry)


def streams_of(gm):
    return {n.name: get_stream(n) for n in gm.graph.nodes if n.op == "call_function"}


def grad_acc():
    "The seed's scenario: acc1 = g1(s1)+g2(s2) with a user on s2; acc2 = g1+g2 used only by the output."
    b = GraphBuilder()
    t = b.input("tangents_1")
    g1 = b.op(aten.neg.default, t, stream=1)
    g2 = b.op(aten.sin.default, t, stream=2)
    acc1 = b.op(aten.add.Tensor, g1, g2, acc=True, name="acc1")
    use = b.op(aten.mul.Tensor, acc1, t, stream=2)
    acc2 = b.op(aten.add.Tensor, g1, g2, acc=True, name="acc2")
    return b.output(use, acc2)


def chain(user_stream=2):
    b = GraphBuilder()
    t = b.input("tangents_1")
    g1 = b.op(aten.neg.default, t, stream=1)
    g2 = b.op(aten.sin.default, t, stream=1)
    g3 = b.op(aten.cos.default, t, stream=2)
    acc1 = b.op(aten.add.Tensor, g1, g2, acc=True, name="acc1")
    acc2 = b.op(aten.add.Tensor, acc1, g3, acc=True, name="acc2")
    mm = b.op(aten.mm.default, acc2, t, stream=user_stream)
    return b.output(mm)


@pytest.mark.parametrize("upstream", [True, False])
def test_grad_acc_users_before_args(upstream):
    gm = grad_acc()
    assign_backward_streams(gm, upstream=upstream)
    assert streams_of(gm) == {"neg": 1, "sin": 2, "acc1": 2, "mul": 2, "acc2": 1}


def test_reverse_walk_settles_chains():
    gm = chain()
    assign_backward_streams(gm)
    assert streams_of(gm)["acc1"] == 2 and streams_of(gm)["acc2"] == 2
    gm = chain(user_stream=None)   # acc2 has no annotated user: its first annotated arg is g3 (acc1 is still None)
    assign_backward_streams(gm)
    assert streams_of(gm)["acc1"] == 2 and streams_of(gm)["acc2"] == 2


def test_both_modes_identical():
    for make in (grad_acc, chain):
        a, b = make(), make()
        assign_backward_streams(a, upstream=True)
        assign_backward_streams(b)
        assert canonical(a) == canonical(b)


def test_duplicate_args_and_kwargs_order():
    b = GraphBuilder()
    t = b.input("tangents_1")
    g0 = b.op(aten.neg.default, t)            # unannotated first arg
    g1 = b.op(aten.sin.default, t, stream=4)
    acc = b.op(aten.add.Tensor, g0, g0, alpha=1, acc=True)
    acc2 = b.op(aten.add.Tensor, g0, g1, acc=True, name="acc2")
    gm = b.output(acc, acc2)
    assign_backward_streams(gm)
    assert streams_of(gm)["add"] is None      # nothing annotated around it: stays on the current stream
    assert streams_of(gm)["acc2"] == 4


def test_non_acc_nodes_untouched_and_shared_custom_updated_in_place():
    gm = grad_acc()
    acc1 = next(n for n in gm.graph.nodes if n.name == "acc1")
    shared = {"other": "kept"}
    acc1.meta["custom"] = shared
    assign_backward_streams(gm)
    assert shared == {"other": "kept", "stream": 2}
    assert streams_of(gm)["neg"] == 1


def test_second_run_noop_with_warning():
    gm = grad_acc()
    assign_backward_streams(gm)
    before = canonical(gm)
    next(n for n in gm.graph.nodes if n.name == "acc2").meta["custom"]["stream"] = 7
    with pytest.warns(AlreadyProcessedWarning):
        assign_backward_streams(gm)
    assert streams_of(gm)["acc2"] == 7   # not reassigned


def test_bad_stream_names_node_and_changes_nothing():
    gm = grad_acc()
    gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)[0].meta["custom"] = {"stream": 1.5}
    with pytest.raises(StreamAnnotationError, match="node mul"):
        assign_backward_streams(gm)
    accs = [n for n in gm.graph.nodes if n.meta.get("is_gradient_acc")]
    assert [n.meta.get("custom") for n in accs] == [None, None]


def epilogue(src_stream=1, copy_stream=None):
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    new = b.op(aten.mul.Tensor, x, x, stream=src_stream, tag="is_forward")
    cp = b.op(aten.copy_.default, x, new, stream=copy_stream, tag="is_forward")
    return b.output(cp)


@pytest.mark.parametrize("upstream", [True, False])
def test_epilogue_copy_takes_source_stream(upstream):
    gm = epilogue(1, None)
    assign_epilogue_copy_streams(gm, upstream=upstream)
    assert streams_of(gm) == {"mul": 1, "copy_": 1}
    gm = epilogue(1, 1)
    assign_epilogue_copy_streams(gm, upstream=upstream)
    assert streams_of(gm) == {"mul": 1, "copy_": 1}


def test_epilogue_unannotated_source_fresh_current_index():
    gm = epilogue(None, 3)
    with use_registry(StreamRegistry(start=10)):
        assign_epilogue_copy_streams(gm)
    assert streams_of(gm) == {"mul": None, "copy_": 10}
    gm = epilogue(None, None)   # equal (both None): nothing drawn, nothing set
    with use_registry(StreamRegistry(start=10)) as reg:
        assign_epilogue_copy_streams(gm)
    assert streams_of(gm)["copy_"] is None and reg.current_streams == {}


def test_epilogue_missing_val_names_source():
    gm = epilogue(None, 3)
    mul = gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)[0]
    del mul.meta["val"]
    with pytest.raises(MissingValError, match="node mul"):
        assign_epilogue_copy_streams(gm)
    assert streams_of(gm)["copy_"] == 3
    gm = epilogue(1, None)          # annotated source: its val is not read
    gm.graph.find_nodes(op="call_function", target=aten.mul.Tensor)[0].meta.pop("val")
    assign_epilogue_copy_streams(gm)
    assert streams_of(gm)["copy_"] == 1


def test_epilogue_second_run_noop():
    gm = epilogue(1, None)
    assign_epilogue_copy_streams(gm)
    gm.graph.find_nodes(op="call_function", target=aten.copy_.default)[0].meta["custom"]["stream"] = 5
    with pytest.warns(AlreadyProcessedWarning):
        assign_epilogue_copy_streams(gm)
    assert streams_of(gm)["copy_"] == 5


def test_against_torch_oracle():
    oracle = pytest.importorskip("oracle")
    cases = [(grad_acc, "assign_backward_streams"), (chain, "assign_backward_streams"),
             (lambda: epilogue(None, 3), "assign_epilogue_copy_streams"), (epilogue, "assign_epilogue_copy_streams")]
    for make, p in cases:
        ref = oracle.run_torch(make(), (p,), impl="seed", mode="gpu", start=10)
        ours = oracle.run_streamnb(make(), (p,), mode="gpu", start=10, upstream=True, device="unused")
        assert oracle.mismatch(ref, ours) is None


def _mutate_then_join():
    "PyTorch #197416's program: `x.add_(1)` on side stream 1, the user joins stream 0 to stream 1, then returns."
    from streamnb.graph import streams
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    new = b.op(aten.add.Tensor, x, x, stream=1, tag="is_forward")
    b.sync(streams.wait_stream.default, 0, 1, tag="is_forward")
    out = b.op(aten.neg.default, new, stream=0, tag="is_forward")
    b.op(aten.copy_.default, x, new, tag="is_forward")
    return b.output(out)


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(strict=True, reason="the seed's defect"))])
def test_correction_13_write_back_before_the_join(upstream):
    gm = _mutate_then_join()
    assign_epilogue_copy_streams(gm, upstream=upstream)
    names = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    assert names.index("copy_") < names.index("wait_stream_default")


def test_correction_13_keeps_the_copy_where_the_old_value_is_still_read():
    from streamnb.graph import streams
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    new = b.op(aten.add.Tensor, x, x, stream=1, tag="is_forward")
    b.sync(streams.wait_stream.default, 0, 1, tag="is_forward")
    old = b.op(aten.neg.default, x, stream=0, tag="is_forward")   # reads the input's old value after the join
    b.op(aten.copy_.default, x, new, tag="is_forward")
    gm = b.output(old)
    assign_epilogue_copy_streams(gm)
    assert [n.name for n in gm.graph.nodes if n.op == "call_function"][-1] == "copy_"
