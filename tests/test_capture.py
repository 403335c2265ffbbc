"""streamnb.capturing: real models -> joint graph before the stream passes -> processed, partitioned, run on the CPU."""
import functools
import operator
import warnings

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from streamnb.capturing import Capture, capture, eager
from streamnb.cpustreams import RunResult, run_graph
from streamnb.partitioning import forward_deps_of_backward_syncs
from streamnb.tracing import AnnotationError, CaptureError, NoGradError, PartitionError, TraceError
from streamnb.examples import MODELS, STREAM_MODELS, NoStreams, make_model, two_stream_fn
from streamnb.graph import StreamAnnotationError, StreamnbError, canonical, get_stream, is_control_deps
from streamnb.streamops import decode

streams = torch.ops.streams

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

EXPECTED_STREAMS = {"two_branch_mlp": {1, 2}, "transformer_block": {1, 2}, "side_stream_consumer": {1}, "no_streams": set()}


@functools.lru_cache(maxsize=None)
def captured(name):
    model, inputs = make_model(name)
    return model, inputs, capture(model, *inputs)


@functools.lru_cache(maxsize=None)
def processed(name, partitioner="default"):
    return captured(name)[2].process(partitioner=partitioner)


def assert_same(res, ref):
    assert_close(res.outputs, ref.outputs)
    assert len(res.grads) == len(ref.grads)
    for g, r in zip(res.grads, ref.grads):
        assert (g is None) == (r is None)
        if g is not None: assert_close(g, r)
    assert res.param_grads.keys() == ref.param_grads.keys()
    for k in ref.param_grads: assert_close(res.param_grads[k], ref.param_grads[k], msg=k)


def value_of(n):
    "What `n` stands for: a `getitem(control_deps, k)` with k >= 1 is the value that control_deps passes through."
    while n.target is operator.getitem and is_control_deps(n.args[0]) and n.args[1] >= 1:
        n = n.args[0].args[n.args[1] + 1]
    return n


def stream_ops(gm):
    return [n for n in gm.graph.nodes if decode(n, gm) is not None]


@pytest.mark.parametrize("name", list(MODELS))
def test_capture_keeps_graph_before_passes(name):
    _, _, cap = captured(name)
    assert isinstance(cap, Capture) and cap.processed is None
    assert cap.streams == EXPECTED_STREAMS[name]
    assert stream_ops(cap.joint) == [] and stream_ops(cap.backward) == []
    for n in cap.joint.graph.nodes:
        if n.op in ("placeholder", "call_function"):
            assert n.meta.get("partitioner_tag") in ("is_forward", "is_backward"), n.name
            assert n.meta["val"].device.type == "meta" if isinstance(n.meta["val"], torch.Tensor) else True
    # backward nodes carry the streams of their forward regions
    bwd_streams = {get_stream(n) for n in cap.joint.graph.nodes if n.meta.get("partitioner_tag") == "is_backward"}
    assert EXPECTED_STREAMS[name] <= bwd_streams


def test_transformer_accumulates_gradients_across_streams():
    _, _, cap = captured("transformer_block")
    accs = [n for n in cap.joint.graph.nodes if n.meta.get("is_gradient_acc")]
    assert accs
    arg_streams = [{get_stream(a) for a in n.all_input_nodes} for n in accs]
    assert any(len(s) > 1 for s in arg_streams), arg_streams
    pc = processed("transformer_block")
    assert any(get_stream(n) is not None for n in pc.joint.graph.nodes if n.meta.get("is_gradient_acc"))


@pytest.mark.parametrize("name", list(MODELS))
def test_unprocessed_run_matches_eager(name):
    model, inputs, cap = captured(name)
    res = cap.run(*inputs)
    assert_same(res, eager(model, *inputs))
    outputs, grads = res                                   # unpacks like a pair
    assert outputs is res.outputs and grads is res.grads
    assert set(res.param_grads) == {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
@pytest.mark.parametrize("name", list(MODELS))
def test_processed_partitions_and_matches_eager(name, partitioner):
    model, inputs, cap = captured(name)
    pc = processed(name, partitioner)
    assert pc.processed["partitioner"] == partitioner and pc.processed["upstream"] is False
    assert forward_deps_of_backward_syncs(pc.joint) == []
    assert all("val" in n.meta for n in pc.joint.graph.nodes if is_control_deps(n))
    ops = stream_ops(pc.backward)
    assert bool(ops) == (name in STREAM_MODELS)
    # in the forward the passes only protect frees (correction 22): records and sync_deallocs, no wait
    assert {decode(n, pc.forward).kind for n in stream_ops(pc.forward)} <= {"record_event", "sync_dealloc"}
    # fresh inputs, not only the example ones
    torch.manual_seed(1)
    xs = tuple(torch.randn_like(x).requires_grad_(x.requires_grad) for x in inputs)
    assert_same(pc.run(*xs), eager(model, *xs))


def test_record_stream_model_gets_a_sync_dealloc():
    pc = processed("side_stream_consumer")
    deallocs = [n for n in pc.backward.graph.nodes if n.target is streams.sync_dealloc.default]
    assert len(deallocs) == 1
    t = value_of(deallocs[0].args[2])        # the dealloc may read the tensor through a control_deps passthrough
    same = {a for a in pc.backward.graph.nodes if value_of(a) is t}
    uses = [u for a in same for u in a.users if u not in same and u is not deallocs[0] and not is_control_deps(u)]
    assert get_stream(t) == 1 and deallocs[0].args[1] == 1
    assert uses and {get_stream(u) for u in uses} == {None}


def test_process_leaves_the_capture_alone():
    _, _, cap = captured("two_branch_mlp")
    before = canonical(cap.joint)
    pc = cap.process()
    assert canonical(cap.joint) == before and stream_ops(cap.joint) == []
    assert stream_ops(pc.joint)
    with pytest.raises(CaptureError, match="already processed"): pc.process()


def test_process_is_deterministic():
    _, _, cap = captured("two_branch_mlp")
    assert canonical(cap.process().backward) == canonical(cap.process().backward)


@pytest.mark.parametrize("name,partitioner,message", [
    ("two_branch_mlp", "default", "was invalid, but is output"),
    ("transformer_block", "default", "Expected native_layer_norm"),
    ("transformer_block", "min_cut", "failed to partition"),
    ("side_stream_consumer", "default", "was invalid, but is output"),
])
def test_upstream_pipeline_is_rejected_by_the_partitioner(name, partitioner, message, tmp_path, monkeypatch):
    _, _, cap = captured(name)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PartitionError, match=message) as e:
        cap.process(upstream=True, partitioner=partitioner)
    assert "depends on forward node" in str(e.value)
    assert list(tmp_path.iterdir()) == []                 # the min-cut partitioner's failure dump stays out of the cwd


@pytest.mark.parametrize("name", list(MODELS))
def test_wrap_pass_gives_backward_syncs_no_forward_deps(name):
    """Correction 7 lives in the wrap pass: streamnb's passes alone leave no forward dep on a backward sync (the seed's
    leave some on every stream model), and `process` changes nothing between the passes and the partitioner but DCE."""
    import copy
    from streamnb.pipeline import run_stream_passes
    from streamnb.graph import StreamRegistry, use_registry
    _, _, cap = captured(name)
    def passes(upstream):
        joint = copy.deepcopy(cap.joint)
        with use_registry(StreamRegistry(start=100, current_stream=cap.current_stream)):
            run_stream_passes(joint, upstream=upstream)
        return joint
    assert forward_deps_of_backward_syncs(passes(upstream=False)) == []
    assert bool(forward_deps_of_backward_syncs(passes(upstream=True))) == (name in STREAM_MODELS)
    joint = passes(upstream=False)
    joint.graph.eliminate_dead_code()
    assert canonical(processed(name).joint) == canonical(joint)


def test_function_with_input_that_needs_no_grad():
    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3)
    cap = capture(two_stream_fn, x, w)
    assert cap.streams == {1, 2} and cap.param_names == []
    res = cap.process().run(x, w)
    assert res.grads[1] is None and res.param_grads == {}
    assert_same(res, eager(two_stream_fn, x, w))


def test_structured_outputs_and_grad_outputs():
    def f(x, y):
        with torch.fx.traceback.annotate({"stream": 1}): a = x.sin() * y
        return {"a": a, "b": (a.cos(), x * 3)}
    x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    cap = capture(f, x, y).process()
    go = [torch.full((4,), 2.0), torch.full((4,), -1.0), torch.full((4,), 0.5)]
    res = cap.run(x, y, grad_outputs=go)
    assert set(res.outputs) == {"a", "b"} and isinstance(res.outputs["b"], tuple)
    assert_same(res, eager(f, x, y, grad_outputs=go))


@pytest.mark.parametrize("name", ["two_branch_mlp", "transformer_block"])
def test_run_executor_hook(name):
    """`executor` runs each graph: the forward then the backward, with the arguments `run_graph` would get; what it
    returns is what `run` uses, and a wrong count of values is refused."""
    model, inputs, _ = captured(name)
    pc = processed(name)
    calls = []
    def logging(gm, *args):
        calls.append((gm, len(args)))
        return run_graph(gm, *args)
    assert_same(pc.run(*inputs, executor=logging), eager(model, *inputs))
    assert [gm for gm, _ in calls] == [pc.forward, pc.backward]
    assert [k for _, k in calls] == [len(list(gm.graph.find_nodes(op="placeholder"))) for gm in (pc.forward, pc.backward)]
    def doubled(gm, *args):   # the backward's outputs are the grads: doubling them must show in the result
        out = run_graph(gm, *args)
        return out if gm is pc.forward else [None if g is None else 2 * g for g in out]
    res, ref = pc.run(*inputs, executor=doubled), pc.run(*inputs)
    assert_close(res.outputs, ref.outputs)
    assert_close(res.grads[0], 2 * ref.grads[0])
    for k in ref.param_grads: assert_close(res.param_grads[k], 2 * ref.param_grads[k])
    with pytest.raises(CaptureError, match="the executor returned 1 values"):
        pc.run(*inputs, executor=lambda gm, *args: run_graph(gm, *args)[:1])


def test_frozen_parameter_has_no_grad():
    model, (x,) = make_model("two_branch_mlp")
    model.head.bias.requires_grad_(False)
    cap = capture(model, x)
    res = cap.run(x)
    assert res.param_grads["head.bias"] is None
    assert_same(res, eager(model, x))


def test_run_uses_current_parameters():
    model, inputs = make_model("no_streams")
    cap = capture(model, *inputs)
    with torch.no_grad(): model.net[0].weight.mul_(2)
    assert_same(cap.run(*inputs), eager(model, *inputs))


def test_no_streams_works_and_says_so():
    model, inputs, cap = captured("no_streams")
    assert cap.streams == set()
    assert cap.notes and "no stream annotations" in cap.notes[0]
    assert stream_ops(processed("no_streams").backward) == []


def test_dynamo_frontend_reads_stream_blocks():
    s1, s2 = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    def f(x, unused, w):
        with s1: a = torch.relu(x @ w)
        with s2: b = torch.tanh(x + 1)
        return a + b
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(2), torch.randn(4, 4, requires_grad=True))
    cap = capture(f, *xs, frontend="dynamo")
    assert cap.streams == {1, 2} and cap.current_stream == 0      # dynamo's numbering with an accelerator (or cpu_streams)
    assert cap.primal_order == [0, 2]                       # dynamo dropped the unused input
    res = cap.process().run(*xs)
    assert res.grads[1] is None
    assert_same(res, eager(f, *xs))
    assert capture(f, *xs, frontend="aot").streams == set()   # aot_function alone ignores the blocks
    assert capture(f, *xs).frontend == "dynamo"                # so "auto" asks dynamo


def test_errors():
    def data_dependent(x):
        return x * 2 if x.sum().item() > 0 else x
    with pytest.raises(TraceError, match="could not trace data_dependent"):
        capture(data_dependent, torch.randn(3, requires_grad=True))
    # nothing requires grad: a forward-only capture (issue 45, item 3), no longer a NoGradError; asking it for grads is one
    fwd = capture(two_stream_fn, torch.randn(3, 3), torch.randn(3, 3))
    assert fwd.inference and fwd.backward is None and "nothing requires grad" in fwd.notes[0]
    with pytest.raises(NoGradError, match="forward only"):
        fwd.run(torch.randn(3, 3), torch.randn(3, 3), grad_outputs=[torch.ones(3, 3)])
    assert capture(NoStreams().requires_grad_(False), torch.randn(2, 8)).inference
    def bad_stream(x):
        with torch.fx.traceback.annotate({"stream": "side"}): return x.sin()
    with pytest.raises(AnnotationError, match="stream annotation 'side' is not an int") as e:
        capture(bad_stream, torch.randn(3, requires_grad=True))
    assert isinstance(e.value, StreamAnnotationError) and isinstance(e.value, CaptureError)
    with pytest.raises(CaptureError, match="functools.partial"):
        capture(two_stream_fn, torch.randn(3, 3, requires_grad=True), 2.0)
    with pytest.raises(CaptureError, match="must be tensors"):
        capture(lambda x: (x.sin(), 3), torch.randn(3, requires_grad=True))
    def mutates(x, buf):
        buf.add_(1)
        return x * buf
    assert capture(mutates, torch.randn(3, requires_grad=True), torch.zeros(3)).write_backs == {0: "input 1"}  # issue 45
    def transposes(x, buf):
        buf.t_()
        return x * buf
    with pytest.raises(CaptureError, match="shape or strides of an input or buffer in place"):
        capture(transposes, torch.randn(3, 3, requires_grad=True), torch.zeros(3, 3))
    with pytest.raises(CaptureError, match="frontend"):
        capture(two_stream_fn, torch.randn(3, 3, requires_grad=True), torch.randn(3, 3), frontend="jit")
    _, inputs, cap = captured("no_streams")
    with pytest.raises(CaptureError, match="CPU tensor"): cap.run(torch.randn(2, 8, device="meta"))
    with pytest.raises(CaptureError, match="takes 1 inputs"): cap.run(*inputs, *inputs)
    with pytest.raises(CaptureError, match="not one of"): cap.process(partitioner="greedy")
    assert all(issubclass(c, StreamnbError) for c in (CaptureError, TraceError, NoGradError, PartitionError))


def test_run_result():
    r = RunResult([1], (None,), {"w": 2})
    o, g = r
    assert (o, g, r.outputs, r.grads, r.param_grads) == ([1], (None,), [1], (None,), {"w": 2})


def test_record_stream_mechanism_runs_too():
    model, inputs, cap = captured("side_stream_consumer")
    pc = cap.process(mechanism="record_stream")
    assert any(n.target is streams.record_stream.default for n in pc.backward.graph.nodes)
    assert not any(n.target is streams.sync_dealloc.default for n in pc.backward.graph.nodes)
    assert_same(pc.run(*inputs), eager(model, *inputs))


def test_meta_inputs_capture_but_do_not_run():
    x, w = torch.randn(3, 3, device="meta", requires_grad=True), torch.randn(3, 3, device="meta")
    cap = capture(two_stream_fn, x, w)
    assert cap.streams == {1, 2}
    bw = cap.process().backward
    assert any(decode(n, bw).kind == "wait_event" for n in stream_ops(bw))
    with pytest.raises(CaptureError, match="CPU tensor"): cap.run(x, w)


UPSTREAM_REJECTED = {("two_branch_mlp", "default"), ("transformer_block", "default"), ("transformer_block", "min_cut"),
                     ("side_stream_consumer", "default")}


@pytest.mark.parametrize("partitioner", ["default", "min_cut"])
@pytest.mark.parametrize("name", list(MODELS))
def test_upstream_matches_eager_where_it_partitions(name, partitioner, tmp_path, monkeypatch):
    # the seed's graphs, where torch 2.13's partitioner takes them, compute what eager PyTorch computes;
    # where it rejects them, the test above pins the failure (correction 7, chapter 13)
    model, inputs, cap = captured(name)
    monkeypatch.chdir(tmp_path)
    if (name, partitioner) in UPSTREAM_REJECTED:
        with pytest.raises(PartitionError): cap.process(upstream=True, partitioner=partitioner)
        return
    pc = cap.process(upstream=True, partitioner=partitioner)
    assert bool(stream_ops(pc.backward)) == (name in STREAM_MODELS)
    torch.manual_seed(1)
    xs = tuple(torch.randn_like(x).requires_grad_(x.requires_grad) for x in inputs)
    assert_same(pc.run(*xs), eager(model, *xs))


def test_event_program_is_traced_by_dynamo_on_a_cpu():
    """Issue 27 item 6: a program that records CPU events cannot run eagerly here (torch's CPU backend has no events);
    the default frontend no longer runs it: dynamo traces it under cpu_streams, and eager() runs it with CPU stand-ins."""
    s1 = torch.Stream(device="cpu")
    def with_events(x):
        e = torch.Event(device="cpu")
        with s1:
            a = x.sin(); e.record(s1)
        e.wait()
        return a * 2
    x = torch.randn(3, requires_grad=True)
    cap = capture(with_events, x)
    assert cap.frontend == "dynamo" and len(cap.streams) == 1 and 0 not in cap.streams and cap.current_stream == 0
    assert_same(cap.process().run(x), eager(with_events, x))
    with pytest.raises(TraceError, match="AOTAutograd could not trace with_events: RuntimeError: cpu backend doesn't "
                                         "support events"):
        capture(with_events, x, frontend="aot")
    def raises(x): raise ValueError("not today")
    with pytest.raises(TraceError, match=r"ValueError: not today\. .*With frontend='dynamo' too: torch.compile \(dynamo\) "
                                         r"could not trace raises"):
        capture(raises, x)
    def annotated(x):   # the same program as annotated regions: aot_function reads it, no dynamo needed
        with torch.fx.traceback.annotate({"stream": 1}): a = x.sin()
        return a * 2
    got = capture(annotated, x)
    assert got.streams == {1} and got.frontend == "aot"


def test_explain_memory_picture_shows_the_blocks_the_seed_holds():
    """17_explain's memory picture: the seed's curve is above streamnb's by exactly the blocks that the seed's wrapped
    syncs keep alive (the attention output in its wrapped wait, corrections 6/7; two MLP gradients in a record's deps,
    correction 21) for a while, never below it, and the peaks are equal."""
    from streamnb.examples import transformer_block_example
    from streamnb.explainer import explain
    from streamnb.graph import is_control_deps
    model, inputs = transformer_block_example()
    ex = explain(model, *inputs, device="H100", check=False)
    up, de = ex.modes["upstream"].timeline, ex.modes["default"].timeline

    def allocated_at(tl, t):
        b = tl.memory[0][1]
        for s, v in tl.memory:
            if s > t: break
            b = v
        return b
    times = sorted({t for t, _ in up.memory} | {t for t, _ in de.memory})
    diff = [allocated_at(up, t) - allocated_at(de, t) for t in times]
    held = [k for k in up.lifetimes if k in de.lifetimes and up.lifetimes[k].free != de.lifetimes[k].free]
    assert held == ["_scaled_dot_product_flash_attention_for_cpu", "mm_1", "gelu_backward"]
    assert all(up.lifetimes[k].free > de.lifetimes[k].free for k in held)
    assert min(diff) == 0 and max(diff) == sum(up.lifetimes[k].nbytes for k in held) > 0
    assert up.peak_memory == de.peak_memory
    deps = {m: {a.name for n in r.backward.graph.nodes if is_control_deps(n) for a in n.args[0]}
            for m, r in ex.modes.items()}
    assert all(k in deps["upstream"] and k not in deps["default"] for k in held)


def test_grad_mode_off_is_named():
    # a module with parameters called under no_grad (inference): its forward alone, and the note says why
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx(): c = capture(torch.nn.Linear(4, 4), torch.randn(2, 4))
        assert c.inference and "grad mode is off" in c.notes[0] and "backward passes do not apply" in c.notes[0]
