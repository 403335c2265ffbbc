"""Issue 27: custom `autograd.Function` backwards, control_deps values and dynamo's current stream under the switch.

Dynamo traces a custom Function as `autograd_function_apply`: the nodes of its backward body keep their stream but
lose `partitioner_tag`, so on main's code the compiled backward gets no syncs for them while `explain` (which traces
with `aot_function`) reports syncs. Stream objects on a CPU are traced under `capturing.cpu_streams()`: dynamo then
registers the ambient current stream at index 0, as on an accelerator."""
from __future__ import annotations

import contextlib
import inspect
import warnings

import pytest
import torch

from test_compile import assert_eager, compile_and_run
from streamnb.examples import annotated_backward
from streamnb.capturing import capture, cpu_streams
from streamnb.cli import main
from streamnb.compiling import DynamoRegistry, tag_custom_backward
from streamnb.exercises import count_syncs
from streamnb.explainer import explain
from streamnb.graph import MissingValError, is_bwd_node, is_control_deps
from streamnb.sanitizer import sanitize
from streamnb.streamops import decode

pytestmark = pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.:FutureWarning")

S = torch.Stream(device="cpu")


class MatmulFunction(torch.autograd.Function):
    "`x @ w`, saving both for a custom backward (each subclass below writes its own)."
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w); return x @ w


class StreamBackward(MatmulFunction):
    "A custom backward with a stream object, joined back with `wait_stream` (a user sync inside the backward)."
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        with S:
            gx = g @ w.t()
        S.wait_stream(S)
        return gx, x.t() @ g


def with_stream(x, w): return torch.relu(StreamBackward.apply(x, w))


def inputs():
    torch.manual_seed(0)
    return (torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True))


def stream_ops(gm) -> list[str]:
    return [op.kind for n in gm.graph.nodes if (op := decode(n, gm)) is not None]


@pytest.mark.parametrize("upstream", [False, True])
def test_custom_backward_gets_explains_syncs(upstream):
    "Fails on main: the compiled backward has no stream op (0 syncs), explain reports 2 (seed) / 4 (default)."
    xs = inputs()
    want = explain(annotated_backward, *xs, check=False).modes["upstream" if upstream else "default"].backward
    sw, graphs, out, grads, _ = compile_and_run(annotated_backward, xs, cpu_as="meta", upstream=upstream)
    assert_eager(annotated_backward, xs, out, grads, {})
    got = graphs["backward"][0]
    assert count_syncs(want) > 0
    assert count_syncs(got) == count_syncs(want)
    assert sorted(stream_ops(got)) == sorted(stream_ops(want))


@pytest.mark.parametrize("upstream", [False, True])
def test_custom_backward_with_stream_object(upstream):
    """Fails on main: only the user's wait_stream is in the backward, nothing orders `g @ w.t()` on S after the
    gradient it reads. The user's sync is tagged must_be_in_backward and stays in the backward graph."""
    xs = inputs()
    with cpu_streams():   # traced as on an accelerator: the ambient current stream is index 0
        sw, graphs, out, grads, _ = compile_and_run(with_stream, xs, cpu_as="meta", upstream=upstream)
    assert_eager(annotated_backward, xs, out, grads, {})
    bw, joint = graphs["backward"][0], sw.graphs[0]
    kinds = stream_ops(bw)
    assert "record_event" in kinds and "wait_event" in kinds and "wait_stream" in kinds
    assert not any("wait_stream" in stream_ops(fw) for fw in graphs["forward"])
    user = [op.call for n in joint.graph.nodes if (op := decode(n, joint)) is not None and op.kind == "wait_stream"]
    assert user and all(c.meta.get("partitioner_tag") == "must_be_in_backward" for c in user)   # kept in the wrap


def test_custom_backward_is_race_free_in_default_mode():
    "Fails on main: the sanitizer finds the race between `threshold_backward` (current stream) and `g @ w.t()` (S)."
    xs = inputs()
    for fn, ctx in ((annotated_backward, contextlib.nullcontext), (with_stream, cpu_streams)):
        with ctx():
            sw, graphs, *_ = compile_and_run(fn, xs, cpu_as="meta")
        report = sanitize(graphs["backward"][0], registry=sw.registries[0])
        assert report.errors == [], (fn.__name__, report.errors)


def test_tags_only_the_untagged_backward():
    "The tagging is a no-op on a joint graph AOTAutograd tagged itself; on the custom body it tags every node."
    from streamnb.capturing import capture
    from test_compile import two_blocks, two_blocks_inputs
    plain = capture(two_blocks, *two_blocks_inputs(), frontend="dynamo").joint
    assert tag_custom_backward(plain) == []
    xs = inputs()
    sw, *_ = compile_and_run(annotated_backward, xs, cpu_as="meta")
    joint = sw.graphs[0]
    side = sw.renumbered[0].get(1, 1)   # the region's stream 1, as dynamo registered it
    body = [n for n in joint.graph.nodes if (n.meta.get("custom") or {}).get("stream") == side]
    assert body and all(is_bwd_node(n) for n in body)
    assert all(n.meta["partitioner_tag"] == "is_forward" for n in joint.graph.nodes
               if n.op == "placeholder" and n.name.startswith("primals"))


def test_control_deps_have_vals_in_default_mode():
    """Fails on main: the compile path gave the control_deps nodes no meta['val'] (only Capture.process did), what
    the partitioner needs for a backward sync whose getitems it saves or outputs (`KeyError: 'val'`)."""
    xs = inputs()
    with cpu_streams():   # traced as on an accelerator: the ambient current stream is index 0
        sw, graphs, out, grads, _ = compile_and_run(with_stream, xs, cpu_as="meta")
    assert_eager(annotated_backward, xs, out, grads, {})
    ctrls = [n for n in sw.graphs[0].graph.nodes if is_control_deps(n)]
    assert ctrls and all("val" in n.meta for n in ctrls)


CUR_S = torch.Stream(device="cpu")

def join_on_current(x):
    "The basic pattern: produce on a side stream, record, wait on the current stream, consume."
    e = torch.Event()
    with CUR_S:
        y = x + 1
        e.record()
    e.wait()
    return y * 2


def test_current_stream_join_is_ordered_by_data():
    """Fails on main: dynamo's stream 0 (the ambient current stream) was not a current stream for the registry, so
    `y * 2` (unannotated) did not count as the wait's consumer and read `y` around the wait (hoistable above it)."""
    x = torch.randn(8, requires_grad=True)
    with cpu_streams():   # traced as on an accelerator: the ambient current stream is index 0
        sw, graphs, out, grads, _ = compile_and_run(join_on_current, (x,), cpu_as="meta")
    torch.testing.assert_close(out, x.detach() * 2 + 2)
    reg, joint = sw.registries[0], sw.graphs[0]
    assert reg.is_current_stream(0) and reg.pinned_current == 0
    wait = next(n for n in joint.graph.nodes if (op := decode(n, joint)) is not None and op.kind == "wait_event")
    assert decode(wait, joint).streams == (0,)
    mul = next(n for n in joint.graph.nodes if n.target is torch.ops.aten.mul.Tensor and "primals" not in str(n.args)
               and not any(a.name.startswith("tangents") for a in n.all_input_nodes))
    src = mul.args[0]
    assert src.target.__name__ == "getitem" and src.args[0] is wait


def test_current_stream_index_in_both_modes():
    "upstream=True keeps a fresh index per lookup and counts 0 as current too; without an accelerator nothing changes."
    x = torch.randn(8, requires_grad=True)
    with cpu_streams():   # traced as on an accelerator: the ambient current stream is index 0
        sw, *_ = compile_and_run(join_on_current, (x,), cpu_as="meta", upstream=True)
    reg = sw.registries[0]
    assert reg.pinned_current is None and 0 in reg.current_streams
    sw, *_ = compile_and_run(annotated_backward, inputs(), cpu_as="meta")
    reg = sw.registries[0]
    assert reg.pinned_current not in (None, 0) and 0 not in reg.current_streams
    assert isinstance(reg, DynamoRegistry)


class JoinThenHandOver(MatmulFunction):
    "Megatron-style: the weight gradient on a side stream, joined, then handed to the current stream with record_stream."
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        s, cur = torch.cuda.Stream(), torch.cuda.current_stream()
        s.wait_stream(cur)
        with torch.cuda.stream(s):
            gw = x.t() @ g
        gx = g @ w.t()
        cur.wait_stream(s)
        gw.record_stream(cur)
        return gx, gw


class HandOver(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.w = torch.nn.Parameter(torch.randn(8, 8))
    def forward(self, x): return JoinThenHandOver.apply(x, self.w).relu()


def test_correction_23_record_stream_after_a_join_in_a_custom_backward():
    "The default processes it (the record_stream gets no wait: it reads no data) and the backward is race-free, in "
    "`Capture.process` and under torch.compile with the switch, equal to eager; the seed fails on the record_stream."
    with cpu_streams():
        m, x = HandOver(), torch.randn(4, 8, requires_grad=True)
        cap = capture(m, x)
        done = cap.process()
        assert not sanitize(done.backward).errors
        with pytest.raises(MissingValError, match="node record_stream"): cap.process(upstream=True)
        sw, graphs, out, grads, pgrads = compile_and_run(m, [x], cpu_as="meta")
        assert_eager(m, [x], out, grads, pgrads)


def test_explain_and_the_cli_report_the_seed_failing_instead_of_aborting(tmp_path, capsys):
    """Where the seed's passes fail (here correction 23's program) `explain` still explains the default: the summary has
    an upstream row of '-' and a note naming the seed's error; the CLI writes the default's files and exits 0."""
    with cpu_streams(): m = HandOver()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ex = explain(m, torch.randn(4, 8, requires_grad=True))
    assert not [w for w in said if "Error detected in" in str(w.message)]   # the aot attempt's anomaly-mode noise
    assert list(ex.modes) == ["default"] and "MissingValError" in ex.seed_failure and "record_stream" in ex.seed_failure
    rows = {r["mode"]: r for r in ex.summary()}
    assert set(rows["upstream"].values()) == {"upstream", None} and rows["default"]["matches_eager"]
    assert "upstream: the seed's passes fail on this program (MissingValError" in ex.summary_text()
    assert not ex.same_schedule() and ex.plot_timelines() is not None
    src = tmp_path / "prog.py"   # the program as a user's file: the Function and the module, inline
    src.write_text("import torch\n" + "\n".join(inspect.getsource(c) for c in (MatmulFunction, JoinThenHandOver, HandOver))
                   + "def make(): return HandOver(), (torch.randn(4, 8, requires_grad=True),)\n")
    assert main(["explain", f"{src}:make", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "the seed's passes fail" in out and (tmp_path / "o" / "backward_default.py").exists()
    assert not (tmp_path / "o" / "backward_upstream.py").exists()
