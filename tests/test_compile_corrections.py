"""Correction 14 and the forward `control_deps` tag, end to end through `torch.compile` on the CPU.

A user's forward sync after a LayerNorm (a multi-output op) and a user's chained `wait_stream` joins: both reach
AOTAutograd's partitioner, which the seed's wrap (and PyTorch 2.13's own passes) fail. The compiled graphs run on
streamnb's CPU executor and must give eager's numbers."""
from __future__ import annotations

import pytest
import torch
from streamnb.compiling import CompileFailure

from test_compile import (assert_eager, compile_and_run, event_joined_block, joined_blocks, two_blocks,
                          two_blocks_inputs)


def test_correction_14_forward_sync_after_layer_norm_compiles():
    "The transformer block with event joins: the default passes compile it and give eager's outputs and gradients."
    model, twin = event_joined_block("cpu")
    xs = (torch.randn(4, 16, 64, requires_grad=True),)
    sw, graphs, out, grads, pgrads = compile_and_run(model, xs, cpu_as="meta")
    assert_eager(twin, xs, out, grads, pgrads)
    fw = graphs["forward"][0]
    ctrls = [n for n in fw.graph.nodes if n.target is torch.ops.higher_order.control_deps]
    assert ctrls and not any(d.target is torch.ops.aten.native_layer_norm.default for c in ctrls for d in c.args[0])


def test_correction_14_the_seed_fails_on_it():
    "`upstream=True` makes the forward record depend on `native_layer_norm` itself: the partitioner refuses it."
    model, _ = event_joined_block("cpu")
    xs = (torch.randn(4, 16, 64, requires_grad=True),)
    with pytest.raises(CompileFailure, match="Expected native_layer_norm.* to be a tensor") as e:
        compile_and_run(model, xs, cpu_as="meta", upstream=True)
    assert "depends on native_layer_norm, a node with several outputs" in str(e.value) and "correction 14" in str(e.value)


def test_a_compiled_forward_race_is_reported():
    "The side stream reads `h` (made on the current stream) with no wait: `explain` of the compiled graphs names it."
    from streamnb.cpustreams import cpu_streams
    def racy(x, w):
        cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
        h = x @ w
        with torch.cuda.stream(side):
            r = torch.relu(h)
        cur.wait_stream(side)
        return r
    xs = (torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True))
    with cpu_streams():
        sw, graphs, *_ = compile_and_run(racy, xs, cpu_as="meta")
    fw = sw.explain(graphs).reports["forward 0"]
    assert [(e.kind, e.nodes) for e in fw.errors] == [("race", ("relu", "mm"))]


def test_forward_ctrls_stay_in_the_forward():
    """Chained forward `wait_stream` joins (corrections 8 and 11): without the `must_be_in_forward` tag the
    partitioner copies the second join into the backward and saves the first, a tuple without `meta['val']`."""
    xs = two_blocks_inputs()
    sw, graphs, out, grads, _ = compile_and_run(joined_blocks, xs, cpu_as="meta")
    assert_eager(two_blocks, xs, out, grads, {})
    bw = graphs["backward"][0]
    assert all("val" in n.meta for n in bw.graph.nodes if n.op == "placeholder")
    assert not any(n.meta.get("partitioner_tag") == "must_be_in_forward" for n in bw.graph.nodes)


# ---------------------------------------------------------------------------------------------------------------
# Issue 27: newer PyTorch's rules for input mutations around user syncs (corrections 11, 18, 19), end to end.
# AOTAutograd keeps an inference graph's input mutations in the graph (a write-back `copy_`) only with
# `keep_inference_input_mutations=True`, as Inductor asks for it; `executor_backend` leaves them to the runtime wrapper.
# ---------------------------------------------------------------------------------------------------------------

from functorch.compile import make_boxed_func  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

from streamnb import use_streamnb_passes  # noqa: E402
from streamnb.assign import UnorderableWriteBackError  # noqa: E402
from streamnb.cpustreams import run_graph  # noqa: E402
from test_compile import S0, S1  # noqa: E402

E_OUTSIDE = torch.Event(device="cpu")   # never recorded inside the compiled function


def run_compiled(fn, *, keep: bool, upstream: bool = False):
    "Compile `fn(x, y)` on fresh inputs under the switch; run it once. (switch, x after the call, output)."
    torch._dynamo.reset()
    x, y = torch.zeros(4), torch.arange(4.0)
    run = lambda gm, _: make_boxed_func(lambda *a: run_graph(gm, *a))
    backend = aot_autograd(fw_compiler=run, keep_inference_input_mutations=keep)
    with use_streamnb_passes(upstream=upstream, cpu_as="meta") as sw:
        out = torch.compile(fn, backend=backend)(x, y)
    return sw, x, out


def mutate_then_wait_outside(x, y):
    with S1: x.add_(1)
    E_OUTSIDE.wait(S0)
    return y * 2


def mutate_then_synchronize_outside(x, y):
    x.add_(1)
    E_OUTSIDE.synchronize()
    return y * 2


def copies(gm):
    return gm.graph.find_nodes(op="call_function", target=torch.ops.aten.copy_.default)


@pytest.mark.parametrize("fn", [mutate_then_wait_outside, mutate_then_synchronize_outside])
def test_correction_18_input_mutation_then_outside_event_compiles(fn):
    """The wait (correction 12) or host sync (the seed's rule) on an event recorded before the call threads the graph's
    inputs through; the write-back `copy_` keeps writing into the input, so `assert_functional_graph` holds (on main
    the wait's case failed there: 'n=copy_, n.args[0]=getitem')."""
    sw, x, out = run_compiled(fn, keep=True)
    torch.testing.assert_close((x, out), (torch.ones(4), torch.arange(4.0) * 2))
    (copy,) = copies(sw.graphs[0])
    assert copy.args[0].op == "placeholder"


def test_correction_18_the_seed_fails_on_it():
    "`upstream=True`: the seed's `synchronize_event` rewires the write-back's destination; AOTAutograd refuses."
    with pytest.raises(CompileFailure, match=r"n=copy_, n.args\[0\]=getitem") as e:
        run_compiled(mutate_then_synchronize_outside, keep=True, upstream=True)
    assert "node copy_: the write-back of an input writes into getitem" in str(e.value) and "correction 18" in str(e.value)


def join_then_read_input(x, y):
    with S1: x.add_(1)
    S0.wait_stream(S1)
    with S0: return y * 2


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed leaves wait_stream bare"))])
def test_correction_11_compiled_join_orders_the_waiting_streams_read_of_an_input(upstream):
    "After `S0.wait_stream(S1)`, `y * 2` on S0 reads the graph input `y` through the join (as torch 2.13 does)."
    sw, x, out = run_compiled(join_then_read_input, keep=True, upstream=upstream)
    torch.testing.assert_close(out, torch.arange(4.0) * 2)
    gm = sw.graphs[0]
    mul = gm.graph.find_nodes(op="call_function", target=torch.ops.aten.mul.Tensor)[0]
    join = mul.args[0].args[0]
    assert join.target is torch.ops.higher_order.control_deps and "wait_stream" in join.args[1].target


def mutate_on_side_stream_then_mutate_again(x, y):
    with S1: x.add_(1)
    S0.wait_stream(S1)
    with S0: x.mul_(2)
    return y * 2


def copy_after_the_join(x, y):
    with S1: t = x + 1
    S0.wait_stream(S1)
    with S0: x.copy_(t * 2)
    return y * 2


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed compiles it silently"))])
def test_correction_19_out_of_graph_write_back_before_a_join_is_refused(upstream):
    """`x.add_(1)` on S1, then S0 joins S1: the runtime wrapper writes `x` back after the call, after the join
    (PyTorch #197416). Newer PyTorch refuses it; so does the default, saying what to move."""
    with pytest.raises(Exception, match="Move the barrier after the compiled function call") as e:
        run_compiled(join_then_read_input, keep=False, upstream=upstream)
    assert any(isinstance(c, UnorderableWriteBackError) for c in _chain(e.value))


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="the seed compiles it silently"))])
def test_correction_19_mutation_spanning_a_join_is_refused(upstream):
    "`x.add_(1)` before the join and `x.mul_(2)` after: the one in-graph write-back cannot honour the join."
    with pytest.raises(Exception, match="spans a stream barrier"):
        run_compiled(mutate_on_side_stream_then_mutate_again, keep=True, upstream=upstream)


def test_correction_19_a_copy_made_after_the_join_compiles():
    "`x.copy_(t * 2)` after the join: one mutation, after the barrier; nothing to refuse, eager's numbers."
    sw, x, out = run_compiled(copy_after_the_join, keep=True)
    torch.testing.assert_close((x, out), (torch.full((4,), 2.0), torch.arange(4.0) * 2))


def _chain(e):
    "`e` and the exceptions it was raised from."
    while e is not None:
        yield e
        e = e.__cause__ or e.__context__


# ---------------------------------------------------------------------------------------------------------------
# Issue 27, item 4: an input mutated on a side stream is written back only after that stream's work. In the graph
# (`keep_inference_input_mutations=True`) the write-back `copy_` runs on the mutation's stream, after it; outside it
# the runtime wrapper copies on the stream `populate_fw_metadata_with_stream_indices` records
# (`mutated_inp_stream_indices`, read by torch's runtime_wrappers.py).
# ---------------------------------------------------------------------------------------------------------------

def mutate_on_the_side_stream(x, y):
    with S1: x.add_(1)
    return y * 2


@pytest.mark.parametrize("keep", [True, False])
def test_side_stream_mutation_is_written_back_on_its_stream(keep, monkeypatch):
    import streamnb.compiling as C
    from streamnb.cpustreams import cpu_streams
    from streamnb.graph import get_stream
    seen = []
    run_pass = C.run_pass
    def spy(gm, name, *args, **kw):
        if name == "populate_fw_metadata_with_stream_indices": seen.append(args[0])
        return run_pass(gm, name, *args, **kw)
    monkeypatch.setattr(C, "run_pass", spy)
    with cpu_streams():
        sw, x, out = run_compiled(mutate_on_the_side_stream, keep=keep)
    torch.testing.assert_close((x, out), (torch.ones(4), torch.arange(4.0) * 2))
    side = {get_stream(n) for n in sw.graphs[0].graph.nodes if n.target is torch.ops.aten.add.Tensor}
    assert len(side) == 1 and side != {0}
    if keep:
        (copy,) = copies(sw.graphs[0])
        add = copy.args[1]
        assert get_stream(copy) == get_stream(add) and copy > add
    else:
        assert seen and seen[-1].mutated_inp_stream_indices == sorted(side)
