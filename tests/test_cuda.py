"""streamnb.cuda and streamnb.cuda_demos: the executor's dispatch on the CPU (a fake backend that logs), and the GPU
demos on CUDA.

The CPU tests run everywhere. The CUDA tests are skipped without a GPU; they check numbers, never times.
"""
import math
import operator

import pytest
import torch
from torch.fx import GraphModule

from streamnb.graph import GraphBuilder, StreamRegistry, StreamnbError, UnknownEventError, streams, use_registry
from streamnb.simulator import Timeline
from streamnb.cuda import FakeBackend, StreamInterpreter, compare_timelines, measure, measure_capture, run, run_capture
from streamnb.cuda_demos import memory_demo, overlap_demo, processed, race_demo
from streamnb.examples import make_model, matmul_chains, record_wait_graph, missing_wait_graph, side_stream_last_use

aten = torch.ops.aten
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# ---------------------------------------------------------------------------------------------------------------
# Dispatch on the CPU
# ---------------------------------------------------------------------------------------------------------------

def test_record_wait_dispatch():
    fake, x = FakeBackend(), torch.randn(4, 4)
    (out,) = run(record_wait_graph(), x, backend=fake)
    torch.testing.assert_close(out, x * x + x)
    assert fake.log == [("record", "estart", "cur"), ("wait", "estart", "s1"), ("run", "mul", "s1"),
                        ("record", "e100", "s1"), ("wait", "e100", "cur"), ("run", "add", "cur"),
                        ("wait_stream", "cur", "s1")]


def test_wait_on_a_side_stream_creates_it_once():
    fake = FakeBackend()
    run(record_wait_graph(wait_stream=2), torch.ones(2), backend=fake)
    assert ("wait", "e100", "s2") in fake.log
    assert [t for t in fake.log if t == ("wait", "estart", "s2")] == [("wait", "estart", "s2")]
    assert fake.log[-2:] == [("wait_stream", "cur", "s1"), ("wait_stream", "cur", "s2")]


def test_unrecorded_event_is_an_error_naming_the_node():
    b = GraphBuilder()
    x = b.input("x")
    b.sync(streams.synchronize_event.default, 42)
    gm = b.output(b.op(aten.neg.default, x))
    with pytest.raises(UnknownEventError, match="node synchronize_event_default: event 42"):
        run(gm, torch.ones(2), backend=FakeBackend())


def test_unknown_stream_op_is_refused(monkeypatch):
    "A stream op without a row in streamops.OPS is refused by name; with a row whose kind has no `_<kind>` method too."
    from streamnb.streamops import OPS, OpSpec
    b = GraphBuilder()
    x = b.input("x")
    b.sync(streams.fork.default, 0, 1)
    gm = b.output(b.op(aten.neg.default, x))
    log = FakeBackend()
    run(gm, torch.ones(2), backend=log)                       # fork: the host's current stream, nothing to do
    assert [t[0] for t in log.log] == ["record", "run"]
    monkeypatch.setitem(OPS, streams.fork.default, OpSpec("teleport"))
    with pytest.raises(StreamnbError, match="node fork_default: the executor does not know stream op teleport"):
        run(gm, torch.ones(2), backend=FakeBackend())
    monkeypatch.delitem(OPS, streams.fork.default)
    with pytest.raises(StreamnbError, match="node fork_default: unknown stream op"):
        run(gm, torch.ones(2), backend=FakeBackend())


def test_current_stream_indices_map_to_one_stream():
    reg = StreamRegistry(start=10)                   # unpinned: every lookup is a fresh index
    b = GraphBuilder()
    x = b.input("x")
    with use_registry(reg):
        e, cur_a, cur_b = reg.new_event(), reg.get_current_stream("cuda"), reg.get_current_stream("cuda")
    y = b.op(aten.neg.default, x, stream=3)
    b.sync(streams.record_event.default, e, 3)
    b.sync(streams.wait_event.default, e, cur_a)
    z = b.op(aten.add.Tensor, y, x)
    b.sync(streams.record_stream.default, y, cur_b)
    b.sync(streams.synchronize_stream.default, 3)
    b.sync(streams.wait_stream.default, cur_a, 3)
    b.sync(streams.synchronize_device.default, "cuda", 0)
    gm = b.output(z)
    fake = FakeBackend()
    run(gm, torch.ones(2), backend=fake, registry=reg)
    assert fake.log == [("record", "estart", "cur"), ("wait", "estart", "s3"), ("run", "neg", "s3"),
                        ("record", "e10", "s3"), ("wait", "e10", "cur"), ("run", "add", "cur"),
                        ("record_stream", "neg", "cur"), ("synchronize_stream", "s3"), ("wait_stream", "cur", "s3"),
                        ("synchronize_device", "cuda", 0), ("wait_stream", "cur", "s3")]
    # the same graph under the default registry (current stream pinned to 0): 11 and 12 are side streams
    fake = FakeBackend()
    run(gm, torch.ones(2), backend=fake)
    assert ("wait", "e10", "s11") in fake.log and ("record_stream", "neg", "s12") in fake.log


def test_single_stream_maps_everything_to_the_current_stream():
    fake = FakeBackend()
    run(record_wait_graph(wait_stream=2), torch.ones(2), backend=fake, single_stream=True)
    assert {t[-1] for t in fake.log if t[0] in ("run", "record", "wait")} == {"cur"}
    assert not any(t[0] == "wait_stream" for t in fake.log)


class AliveAtWait(FakeBackend):
    def wait(self, event, stream):
        super().wait(event, stream)
        self.log.append(("alive", sorted(n.name for n in self.interp.env)))


@pytest.mark.parametrize("with_dealloc", [True, False])
def test_sync_dealloc_keeps_the_tensor_alive_until_the_wait(with_dealloc):
    b = GraphBuilder()
    x = b.input("x")
    t = b.op(aten.mul.Tensor, x, x, stream=0)
    u = b.op(aten.neg.default, t, stream=1)
    b.sync(streams.record_event.default, 100, 1)
    v = b.op(aten.add.Tensor, x, x, stream=0)
    if with_dealloc: b.sync(streams.sync_dealloc.default, 100, 0, t)
    else: b.sync(streams.wait_event.default, 100, 0)
    gm = b.output(u, v)
    fake = AliveAtWait()
    fake.interp = interp = StreamInterpreter(gm, fake)
    x = torch.randn(3)
    u, v = interp.run(x)
    torch.testing.assert_close((u, v), (-(x * x), x + x))
    i = fake.log.index(("wait", "e100", "cur"))
    assert ("mul" in fake.log[i + 1][1]) == with_dealloc
    assert "mul" not in [n.name for n in interp.env]


def test_record_stream_dispatch():
    b = GraphBuilder()
    x = b.input("x")
    t = b.op(aten.mul.Tensor, x, x)
    b.sync(streams.record_stream.default, t, 1)
    gm = b.output(b.op(aten.neg.default, t, stream=1))
    fake = FakeBackend()
    run(gm, torch.ones(2), backend=fake)
    assert ("record_stream", "mul", "s1") in fake.log


def test_control_deps_runs_the_held_sync_and_passes_deps_through():
    from torch._inductor.fx_passes.control_dependencies import control_deps
    gm = record_wait_graph()
    g = gm.graph
    mul = next(n for n in g.nodes if n.name == "mul")
    rec = next(n for n in g.nodes if n.target is streams.record_event.default)
    sub = torch.fx.Graph()
    dep = sub.placeholder("dep_0")
    sub.output((sub.call_function(streams.record_event.default, rec.args), dep))
    gm.subgraph_record_event_default = GraphModule(torch.nn.Module(), sub)
    with g.inserting_before(rec):
        ctrl = g.call_function(control_deps, ((mul,), g.get_attr("subgraph_record_event_default"), mul))
    with g.inserting_after(ctrl):
        item = g.call_function(operator.getitem, (ctrl, 1))
    next(n for n in g.nodes if n.name == "add").replace_input_with(mul, item)
    g.erase_node(rec)
    gm.recompile()
    fake, x = FakeBackend(), torch.randn(4, 4)
    (out,) = run(gm, x, backend=fake)
    torch.testing.assert_close(out, x * x + x)
    assert fake.log[2:5] == [("run", "mul", "s1"), ("record", "e100", "s1"), ("wait", "e100", "cur")]


def test_device_arguments_are_remapped():
    b = GraphBuilder()
    x = b.input("x")
    ones = b.op(aten.full.default, [4, 4], 1.0, dtype=torch.float32, device=torch.device("meta"))
    gm = b.output(b.op(aten.add.Tensor, x, ones))
    (out,) = run(gm, torch.zeros(4, 4), backend=FakeBackend(), device="cpu")
    torch.testing.assert_close(out, torch.ones(4, 4))
    with pytest.raises(Exception):   # without remapping, a meta tensor meets a CPU one
        run(gm, torch.zeros(4, 4), backend=FakeBackend())


def test_measure_on_the_fake_backend_gives_a_timeline():
    out, tl = measure(record_wait_graph(), torch.ones(2), backend=FakeBackend(), warmup=1)
    assert isinstance(tl, Timeline)
    assert {n: s for n, (s, _, _) in tl.spans.items()} == {"mul": 1, "add": 0}
    assert all(0 <= a <= b <= tl.makespan for _, a, b in tl.spans.values())
    assert tl.current_stream == 0 and tl.streams == [0, 1]


def test_compare_timelines():
    m = Timeline(spans={"a": (0, 0.0, 2.0), "b": (1, 1.0, 5.0), "z": (0, 2.0, 2.0)}, makespan=5.0)
    e = Timeline(spans={"a": (0, 0.0, 1.0), "b": (1, 0.0, 6.0), "z": (0, 1.0, 1.5), "q": (1, 6.0, 7.0)}, makespan=7.0)
    c = compare_timelines(m, e)
    assert (c.nodes["a"], c.nodes["b"], c.makespan) == (-0.5, 0.5, 0.4)
    assert math.isnan(c.nodes["z"]) and c.only_estimated == ["q"] and c.only_measured == []
    assert c.diff_ms == {"a": -1.0, "b": 2.0, "z": 0.5}
    assert c.worst(2) == [("b", 0.5, 2.0), ("a", -0.5, -1.0)]


def test_race_graph_dispatch_upstream_vs_corrected():
    logs = {}
    x, w = torch.randn(8, 8), torch.randn(8, 8) / 3
    for up in (True, False):
        gm, reg = processed(lambda: missing_wait_graph(n=8, length=3), upstream=up)
        logs[up] = FakeBackend()
        c0, c2 = run(gm, x, w, backend=logs[up], registry=reg)
        torch.testing.assert_close(c2, -(x @ w @ w @ w))
    side_waits = lambda log: [t for t in log if t[0] == "wait" and t[2] == "s2" and t[1] != "estart"]
    assert side_waits(logs[True].log) == []
    assert len(side_waits(logs[False].log)) >= 1
    # the corrected wait on s2 comes after p2's record on s1 and before c2
    log = logs[False].log
    (ev,) = {t[1] for t in side_waits(log)}
    assert log.index(("record", ev, "s1")) < log.index(("wait", ev, "s2")) < log.index(("run", "c2", "s2"))


@pytest.mark.parametrize("make", [lambda: matmul_chains(8, 3), lambda: missing_wait_graph(8, 3),
                                  lambda: side_stream_last_use(8, 3)], ids=["chains", "race", "dealloc"])
@pytest.mark.parametrize("upstream", [True, False])
@pytest.mark.parametrize("mechanism", ["sync_dealloc", "record_stream"])
def test_processed_demo_graphs_compute_the_same_numbers(make, upstream, mechanism):
    gm, reg = processed(make, upstream=upstream, mechanism=mechanism)
    ins = [torch.randn(8, 8) / 3 for n in gm.graph.nodes if n.op == "placeholder"]
    ref = run(make(), *ins, backend=FakeBackend(), single_stream=True)
    torch.testing.assert_close(run(gm, *ins, backend=FakeBackend(), registry=reg), ref)


@pytest.mark.parametrize("seed", range(12))
def test_generated_graphs_run_after_the_passes(seed):
    "Every graph the passes produce runs on the executor: each wait has its record, and the numbers are unchanged."
    from graphgen import random_backward_graph
    make = lambda: random_backward_graph(seed)
    gm = make()
    ins = [torch.randn(n.meta["val"].shape) / 2 for n in gm.graph.nodes if n.op == "placeholder"]
    ref = run(gm, *[t.clone() for t in ins], backend=FakeBackend(), single_stream=True, device="cpu")
    gm, reg = processed(make)
    out = run(gm, *[t.clone() for t in ins], backend=FakeBackend(), registry=reg, device="cpu")
    torch.testing.assert_close(out, ref, equal_nan=True)


def test_the_gpu_demos_run_on_the_fake_backend():
    "The demos' code paths on the CPU (tiny sizes): every output is right because the CPU runs ops one by one."
    r = overlap_demo(n=16, length=2, device="cpu", warmup=1, backend=FakeBackend())
    assert r["same_outputs"] and {s for s, _, _ in r["two"].spans.values()} == {1, 2}
    assert {s for s, _, _ in r["one"].spans.values()} == {0} and r["speedup"] > 0
    r = race_demo(n=16, length=3, device="cpu", trials=2, backend=FakeBackend())
    assert len(r["upstream"]) == len(r["corrected"]) == 2
    assert max(max(e) for e in r["upstream"] + r["corrected"]) < 1e-5
    rows = memory_demo(n=16, length=2, device="cpu", backend=FakeBackend())
    assert [r["max_error"] < 1e-5 for r in rows] == [True] * 3
    assert all(isinstance(r["timeline"], Timeline) and r["timeline"].spans for r in rows)


def _captured(name, upstream=False, math_sdpa=True):
    "A processed capture; `math_sdpa`: trace attention as plain matmuls (a CPU trace otherwise holds CPU-only kernels)."
    from contextlib import nullcontext
    from torch.nn.attention import sdpa_kernel, SDPBackend
    from streamnb.capturing import capture
    model, inputs = make_model(name)
    with sdpa_kernel(SDPBackend.MATH) if math_sdpa else nullcontext():
        return capture(model, *inputs).process(upstream=upstream), inputs


def test_run_capture_refuses_cpu_only_kernels_on_another_device():
    cap, inputs = _captured("transformer_block", math_sdpa=False)
    with pytest.raises(StreamnbError, match="is a CPU-only kernel"):
        run_capture(cap, *inputs, backend=FakeBackend(), device="meta")


def _assert_same_result(res, ref):
    torch.testing.assert_close(res.outputs, ref.outputs)
    torch.testing.assert_close([g for g in res.grads if g is not None], [g for g in ref.grads if g is not None])
    assert sorted(res.param_grads) == sorted(ref.param_grads)
    for k in ref.param_grads: torch.testing.assert_close(res.param_grads[k], ref.param_grads[k])


@pytest.mark.parametrize("name", ["two_branch_mlp", "transformer_block", "side_stream_consumer"])
def test_run_capture_on_the_fake_backend_matches_capture_run(name):
    cap, inputs = _captured(name)
    fake = FakeBackend()
    _assert_same_result(run_capture(cap, *inputs, backend=fake), cap.run(*inputs))
    assert any(t[0] == "wait" and t[1] != "estart" for t in fake.log)   # the backward's syncs were dispatched


def test_measure_capture_on_the_fake_backend():
    cap, inputs = _captured("two_branch_mlp")
    res, tls = measure_capture(cap, *inputs, backend=FakeBackend())
    _assert_same_result(res, cap.run(*inputs))
    assert set(tls) == {"forward", "backward"}
    bw_compute = [n.name for n in cap.backward.graph.nodes if n.op == "call_function"
                  and getattr(n.target, "namespace", None) != "streams" and n.target is not operator.getitem
                  and not n.name.startswith("control_deps")]
    assert set(tls["backward"].spans) == set(bw_compute)
    assert {s for s, _, _ in tls["backward"].spans.values()} == {0, 1, 2}
    assert {s for s, _, _ in tls["forward"].spans.values()} == {0}      # the forward has no syncs: one stream


def test_run_capture_forward_streams():
    cap, inputs = _captured("two_branch_mlp")
    for forward_streams in (False, True):
        fake = FakeBackend()
        _assert_same_result(run_capture(cap, *inputs, backend=fake, forward_streams=forward_streams), cap.run(*inputs))
        n_fw = sum(1 for n in cap.forward.graph.nodes if n.op == "call_function" and n.target is not operator.getitem)
        fw_streams = {t[2] for t in [t for t in fake.log if t[0] == "run"][:n_fw]}
        assert (fw_streams == {"cur"}) == (not forward_streams)


# ---------------------------------------------------------------------------------------------------------------
# On a CUDA device (numbers only; times are printed by the notebook, never asserted)
# ---------------------------------------------------------------------------------------------------------------

@cuda
def test_cuda_record_wait_graph():
    x = torch.randn(64, 64, device="cuda")
    (out,) = run(record_wait_graph(), x, device="cuda")
    torch.testing.assert_close(out, x * x + x)


@cuda
def test_cuda_overlap_demo_outputs_agree():
    r = overlap_demo(n=512, length=4, warmup=1)
    assert r["same_outputs"]
    for tl in (r["one"], r["two"]):
        assert len(tl.spans) == 8 and all(a <= b for _, a, b in tl.spans.values())
    assert {s for s, _, _ in r["two"].spans.values()} == {1, 2}


@cuda
def test_cuda_race_demo():
    r = race_demo(n=4096, length=8, trials=3)
    assert all(max(e) < 1e-3 for e in r["corrected"]), r["corrected"]
    # c0 has its wait in both graphs; c2 (stream 2) has none in the seed's graph and reads p7 before it is written.
    assert all(e[0] < 1e-3 for e in r["upstream"]), r["upstream"]
    assert any(e[1] > 1e-2 for e in r["upstream"]), f"the seed's race did not show: {r['upstream']}"


@cuda
def test_cuda_memory_demo_numbers():
    rows = memory_demo(n=2048, length=4)
    assert [(r["mechanism"], r["upstream"]) for r in rows] == [("record_stream", False), ("sync_dealloc", False),
                                                               ("sync_dealloc", True)]
    assert all(r["max_error"] < 1e-3 for r in rows), rows
    assert all(r["peak_allocated"] > 0 for r in rows)


@cuda
@pytest.mark.parametrize("name", ["two_branch_mlp", "transformer_block", "side_stream_consumer"])
def test_cuda_run_capture_matches_capture_run(name):
    cap, inputs = _captured(name)
    res = run_capture(cap, *inputs, device="cuda")
    ref = cap.run(*inputs)
    to_cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t
    torch.testing.assert_close(to_cpu(res.outputs), ref.outputs, rtol=1e-4, atol=1e-5)
    for k in ref.param_grads:
        torch.testing.assert_close(to_cpu(res.param_grads[k]), ref.param_grads[k], rtol=1e-4, atol=1e-5)


def test_every_cuda_cell_says_gpu_and_follows_its_estimate():
    """19a_cuda_demos: each `#| cuda` cell says its output comes from a GPU run, and the code cell before it (not a cuda cell)
    prints the simulator's estimate for the same demo."""
    import json
    from pathlib import Path
    cells = [c for c in json.loads((Path(__file__).parent.parent / "nbs" / "19a_cuda_demos.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    src = ["".join(c["source"]) for c in cells]
    is_cuda = ["#| cuda" in s.splitlines()[:2] for s in src]
    assert sum(is_cuda) >= 5
    for i, s in enumerate(src):
        if not is_cuda[i]: continue
        assert "output from a GPU run only" in s and "NO_GPU" in s
        assert not is_cuda[i - 1] and "simulate(" in src[i - 1], f"cuda cell {i}: no estimate cell before it"


def test_gpu_measurements_refuses_without_cuda():
    "benchmarks/gpu_measurements.py imports and, without CUDA, says that it needs a device (with CUDA it measures)."
    import subprocess, sys
    from pathlib import Path
    if torch.cuda.is_available(): pytest.skip("CUDA is available: tools/gpu_check.sh runs the script for real")
    p = subprocess.run([sys.executable, str(Path(__file__).parent.parent / "benchmarks" / "gpu_measurements.py")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "needs a CUDA device" in p.stderr, p.stderr
