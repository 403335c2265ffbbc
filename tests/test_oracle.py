"""Differential tests: streamnb with `upstream=True` must give exactly the graph PyTorch's own passes give.

The reference is the seed variant of torch 2.13's streams.py, derived in memory and run on the CPU with stubs
(tests/oracle.py). Each case runs in "gpu" mode (`is_available()` forced True: sync_dealloc only, streamnb
`mechanism="sync_dealloc"`) and in "cpu" mode (the seed's record_stream fallback as well, streamnb
`mechanism="record_stream"`). Graphs are compared with `streamnb.graph.canonical(rename_events=True)`: names,
ops, targets, args, kwargs, partitioner tags, streams and the control_deps subgraphs.
"""
import logging

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import torch
import torch.fx.traceback as fxt

import graphgen
import oracle
from oracle import MODES, PIPELINE, WRAP
from streamnb.examples import cross_stream, user_syncs
from streamnb.graph import GraphBuilder

aten = torch.ops.aten
streams = torch.ops.streams
logging.getLogger("torch._inductor.utils").setLevel(logging.ERROR)

# ----------------------------------------------------------------------------------------------------------------
# Hand-written scenarios; each returns a fresh graph
# ----------------------------------------------------------------------------------------------------------------


def grad_acc_of_products():
    "acc1 has a user on s2 (users win over args) -> s2; acc2 only feeds the output -> its first annotated arg, s1."
    b = GraphBuilder()
    x, g = b.input("primals_1", tag="is_forward"), b.input("tangents_1")
    g1 = b.op(aten.mul.Tensor, g, x, stream=1)
    g2 = b.op(aten.mul.Tensor, g, g, stream=2)
    acc1 = b.op(aten.add.Tensor, g1, g2, acc=True)
    use = b.op(aten.neg.default, acc1, stream=2)
    acc2 = b.op(aten.add.Tensor, g1, g2, acc=True)
    return b.output(use, acc2)


def multi_consumer():
    "One producer on s1, consumers on s0 then s2: the seed waits only before the first."
    b = GraphBuilder()
    g = b.input("tangents_1")
    p = b.op(aten.mul.Tensor, g, g, stream=1)
    return b.output(b.op(aten.neg.default, p, stream=0), b.op(aten.sin.default, p, stream=2))


def unannotated():
    "An unannotated producer read on s1: fresh current-stream indices from the shared counter."
    b = GraphBuilder()
    g = b.input("tangents_1")
    p = b.op(aten.mul.Tensor, g, g)
    return b.output(b.op(aten.neg.default, p, stream=1))


def timeline():
    "meta['value'] holds real tensors: non-zero estimates, so sync_dealloc moves down the allocating stream."
    b = GraphBuilder()
    small, big = torch.empty(16), torch.empty(1 << 16)
    def v(n, t): n.meta["value"] = t; return n
    g = v(b.input("tangents_1"), small)
    a = v(b.op(aten.mul.Tensor, g, g, stream=0), small)
    side = v(b.op(aten.add.Tensor, a, a, stream=1), big)
    c1 = v(b.op(aten.neg.default, g, stream=0), small)
    c2 = v(b.op(aten.mul.Tensor, c1, c1, stream=0), big)
    c3 = v(b.op(aten.neg.default, c2, stream=0), big)
    c4 = v(b.op(aten.neg.default, c3, stream=0), small)
    return b.output(side, c4)


def cpu_device():
    "cross_stream with CPU tensors: no record/wait pair (device check), but the dealloc sync still comes."
    b = GraphBuilder(device="cpu")
    x, g = b.input("primals_1", tag="is_forward"), b.input("tangents_1")
    mul = b.op(aten.mul.Tensor, g, x, stream=1)
    return b.output(b.op(aten.add.Tensor, mul, x, stream=0))


def wait_stream():
    "wait_stream(1, 0) with meta['val'] = None: an ordinary node for the seed, a wrapped sync for torch 2.13."
    b = GraphBuilder()
    x = b.input("x", tag=None)
    m = b.op(aten.mul.Tensor, x, x, stream=0, tag=None)
    b.sync(streams.wait_stream.default, 1, 0).meta["val"] = None
    a = b.op(aten.add.Tensor, x, x, stream=1, tag=None)
    b.sync(streams.record_event.default, 8, 1)
    return b.output(m, a)


SCENARIOS = {f.__name__: (f, WRAP if f in (user_syncs, wait_stream) else PIPELINE)
             for f in (cross_stream, grad_acc_of_products, multi_consumer, unannotated, timeline, cpu_device, user_syncs, wait_stream)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(name, mode):
    make, passes = SCENARIOS[name]
    diff = oracle.check(make, passes, mode=mode)
    assert diff is None, f"{name} ({mode}): streamnb upstream=True differs from the seed:\n{diff}"


# ----------------------------------------------------------------------------------------------------------------
# Generated graphs, full pipeline
# ----------------------------------------------------------------------------------------------------------------

GEN_SEEDS = range(120)


def _gen(seed):
    # vary the shape of the graphs with the seed; copy_ and forward prefixes in some of them
    return lambda: graphgen.random_backward_graph(seed, n_nodes=8 + seed % 23, n_forward=seed % 3,
                                                  p_user_sync=(0.0, 0.08, 0.25)[seed % 3],
                                                  p_copy=0.1 if seed % 4 == 0 else 0.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", GEN_SEEDS)
def test_generated(seed, mode):
    diff = oracle.check(_gen(seed), PIPELINE, mode=mode)
    assert diff is None, f"graphgen seed {seed} ({mode}):\n{diff}"


def test_generated_graphs_exercise_the_passes():
    "The generated graphs are not trivial: torch's passes insert syncs, deallocs and control_deps in most."
    from streamnb.graph import is_control_deps
    kinds = {"record_event": 0, "sync_dealloc": 0, "control_deps": 0, "record_stream": 0}
    for seed in range(0, 120, 6):
        for mode in MODES:
            gm = oracle.run_torch(_gen(seed)(), mode=mode)
            for n in gm.graph.nodes:
                if is_control_deps(n): kinds["control_deps"] += 1
                for k in kinds:
                    if n.op == "get_attr" and k in n.target: kinds[k] += 1
                    if n.op == "call_function" and k in str(n.target): kinds[k] += 1
    assert all(v > 10 for v in kinds.values()), kinds


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gm=graphgen.graphs(), mode=st.sampled_from(MODES))
def test_hypothesis_graphs(gm, mode):
    ref = oracle.run_torch(oracle.copy_gm(gm), mode=mode)
    diff = oracle.mismatch(ref, oracle.run_streamnb(gm, mode=mode))
    assert diff is None, diff


def test_default_mode_is_told_apart():
    "The harness sees streamnb's corrected passes differ from the seed where the seed is wrong."
    ref = oracle.run_torch(multi_consumer())
    assert oracle.mismatch(ref, oracle.run_streamnb(multi_consumer(), upstream=False)) is not None
    differ = sum(oracle.mismatch(oracle.run_torch(_gen(s)()), oracle.run_streamnb(_gen(s)(), upstream=False))
                 is not None for s in range(0, 120, 10))
    assert differ > 0


# ----------------------------------------------------------------------------------------------------------------
# A real joint graph from aot_function
# ----------------------------------------------------------------------------------------------------------------


def three_stream_program(x, y):
    with fxt.annotate({"stream": 1}):
        a = x * y
    with fxt.annotate({"stream": 0}):
        b = a.sin() + x
    with fxt.annotate({"stream": 2}):
        c = (a * 2).cos() @ y
    return (b + c).sum()


def upstream_sync(x, y):
    # the shape of test/dynamo/test_streams.py::test_stream_backward_sync
    with fxt.annotate({"stream": 2}):
        y0 = 2 * x + y
    with fxt.annotate({"stream": 1}):
        z = 2 * x + y
    return y0, z


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [three_stream_program, upstream_sync])
def test_aot_joint_graph(fn, mode):
    x = torch.randn(4, 4, device="meta", requires_grad=True)
    y = torch.randn(4, 4, device="meta", requires_grad=True)
    before, after = oracle.capture_joint(fn, x, y, mode=mode)
    assert any(n.meta.get("partitioner_tag") == "is_backward" for n in before.graph.nodes)
    assert oracle.mismatch(before, after) is not None, "torch's passes did nothing on the joint graph"
    ours = oracle.run_streamnb(before, mode=mode)
    diff = oracle.mismatch(after, ours, ("torch[seed]", "streamnb"))
    assert diff is None, f"{fn.__name__} ({mode}):\n{diff}"


# ----------------------------------------------------------------------------------------------------------------
# The harness itself
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_seed_variant_matches_torch_except_wait_stream(mode):
    for name, (make, passes) in SCENARIOS.items():
        seed = oracle.run_torch(make(), passes, impl="seed", mode=mode)
        t213 = oracle.run_torch(make(), passes, impl="torch", mode=mode)
        diff = oracle.mismatch(seed, t213)
        if name == "wait_stream": assert diff is not None, "wait_stream should tell the seed from torch 2.13"
        else: assert diff is None, f"{name}: seed variant and torch 2.13 differ:\n{diff}"


def test_seed_derivation():
    import inspect
    src = oracle.derive_seed_source()
    assert "wait_stream" not in src and "if not torch.cuda.is_available():" in src
    assert torch.ops.streams.wait_stream.default in oracle.load_impl("torch")._SYNC_OPS
    assert torch.ops.streams.wait_stream.default not in oracle.load_impl("seed")._SYNC_OPS
    t213 = inspect.getsource(oracle.load_impl("torch"))
    with pytest.raises(oracle.AnchorError):   # an anchor that is not unique is refused
        oracle.derive_seed_source(t213 + "\n# if not torch.accelerator.is_available():\n")
    with pytest.raises(oracle.AnchorError):   # so is a missing one (the derived text has none left)
        oracle.derive_seed_source(src)


def test_modes_differ_and_copies_are_independent():
    "cpu mode adds the record_stream fallback; a copied graph processed twice gives the same graph."
    gpu, cpu = oracle.run_torch(cross_stream(), mode="gpu"), oracle.run_torch(cross_stream(), mode="cpu")
    assert oracle.mismatch(gpu, cpu) is not None
    assert any("record_stream" in str(n.target) for n in cpu.graph.nodes)
    for seed in (1, 2, 3):
        g = _gen(seed)()
        c = oracle.copy_gm(g)
        assert oracle.mismatch(g, c) is None
        oracle.run_torch(c)
        assert oracle.mismatch(g, _gen(seed)()) is None, "running on the copy changed the original"
        assert oracle.mismatch(oracle.run_torch(g), c) is None


def test_timeline_scenario_moves_the_dealloc():
    "With meta['value'] the estimates are non-zero: sync_dealloc lands below the record, after later stream-0 work."
    gm = oracle.run_torch(timeline(), PIPELINE[:4])
    names = [n.name for n in gm.graph.nodes]
    i = names.index("sync_dealloc_default")
    assert names[i - 1] == "mul_1" and names.index("record_event_default_1") < i - 2, names


def test_harness_can_fail():
    ref = oracle.run_torch(cross_stream())
    assert oracle.mismatch(ref, oracle.run_torch(multi_consumer())) is not None
    # one stream annotation changed on a copy
    bad = oracle.copy_gm(ref)
    n = next(n for n in bad.graph.nodes if n.name == "add")
    n.meta["custom"]["stream"] = 3
    assert oracle.mismatch(ref, bad) is not None
    # a different counter start changes the current-stream indices of an unannotated graph
    assert oracle.mismatch(oracle.run_torch(unannotated()), oracle.run_torch(unannotated(), start=20)) is not None
    # a changed tag
    bad = oracle.copy_gm(ref)
    next(n for n in bad.graph.nodes if n.name == "mul").meta["partitioner_tag"] = "is_backward"
    assert oracle.mismatch(ref, bad) is not None


def test_one_table_of_the_passes():
    """streamnb runs every pass from one table (pipeline.STREAM_PASSES: graph.PIPELINE_ORDER's joint-graph passes, then
    the metadata pass); it names the passes the installed torch's graph_capture calls, in torch's order (the oracle
    reads them from torch's source, never from streamnb, which it judges)."""
    import torch._functorch._aot_autograd.graph_capture as GC
    from streamnb.graph import PIPELINE_ORDER
    from streamnb.pipeline import STREAM_PASSES
    assert oracle.PIPELINE == PIPELINE_ORDER == tuple(STREAM_PASSES)[:-1]
    assert list(STREAM_PASSES)[-1] == "populate_fw_metadata_with_stream_indices"
    assert all(callable(getattr(GC, n, None)) for n in STREAM_PASSES)


def test_torch_pipeline_reads_the_call_order():
    "The oracle's list follows torch's calls: a torch that moved a pass, or called a non-pass on the graph."
    from unittest import mock
    import torch._functorch._aot_autograd.graph_capture as GC
    def aot_dispatch_autograd_graph(fx_g):
        insert_backward_syncs(fx_g); copy_fwd_metadata_to_bw_nodes(fx_g); assign_backward_streams(fx_g)  # noqa: F821
    with mock.patch.object(GC, "aot_dispatch_autograd_graph", aot_dispatch_autograd_graph):
        assert oracle.torch_pipeline() == ("insert_backward_syncs", "assign_backward_streams")
    with pytest.raises(ValueError, match="pipeline order"):
        oracle.run_streamnb(cross_stream(), ("insert_backward_syncs", "assign_backward_streams"))