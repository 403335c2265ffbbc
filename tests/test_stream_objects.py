"""Programs written with stream objects, as real projects write them (issue 27 items 1 and 6): `torch.cuda.Stream`,
`torch.cuda.stream(...)`, events, `wait_stream`, `record_stream`, `current_stream()`, traced on this CPU under
`streamnb.cpu_streams` and judged like `annotate` programs."""
import contextlib
import io
import itertools
import re
import sys
import textwrap
import types
from unittest import mock

import pytest
import torch
import torch.nn as nn

import streamnb
from streamnb.capturing import capture, eager
from streamnb.cpustreams import CPUEvent, CPUStream, cpu_streams
from streamnb.tracing import CaptureError, TraceError
from streamnb.sanitizer import sanitize
from streamnb.streamops import decode


def sync_ops(gm):
    "(op name, args) of every stream op of `gm`, in order."
    return [(n.target.__name__.split(".")[0], tuple(n.args)) for n in gm.graph.nodes if decode(n) is not None]


def assert_same(got, want):
    torch.testing.assert_close(got.outputs, want.outputs)
    torch.testing.assert_close(got.grads, want.grads)
    torch.testing.assert_close(got.param_grads, want.param_grads)


def fork_join(x, w):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = torch.relu(x @ w)
        done = torch.cuda.Event()
        done.record()
    done.wait()
    return (y * 2).sum()


class SharedExpertMoE(nn.Module):
    "SGLang/vLLM: the shared expert on an alternate stream made in __init__, forked and joined with wait_stream."
    def __init__(self, d=16, experts=3):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(experts)])
        self.shared = nn.Linear(d, d)
        self.alt = torch.cuda.Stream()

    def forward(self, x):
        cur = torch.cuda.current_stream()
        self.alt.wait_stream(cur)
        with torch.cuda.stream(self.alt):
            shared = self.shared(x)
        gates = torch.softmax(self.router(x), -1)
        routed = sum(gates[:, i:i + 1] * e(x) for i, e in enumerate(self.experts))
        cur.wait_stream(self.alt)
        return routed + shared


def test_fork_join_with_cuda_objects_is_captured_on_a_cpu():
    "Fails on 5425faa: capture used aot_function only, which calls torch.cuda.Stream() and fails without CUDA."
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    cap = capture(fork_join, *xs)
    assert (cap.frontend, cap.streams, cap.current_stream) == ("dynamo", {1}, 0)
    assert sync_ops(cap.forward) == [("wait_stream", (1, 0)), ("record_event", (2, 1)), ("wait_event", (2, 0))]
    assert_same(cap.process().run(*xs), eager(fork_join, *xs))
    assert_same(cap.process(upstream=True).run(*xs), eager(fork_join, *xs))


def test_current_stream_aliases_are_index_0():
    "`torch.accelerator.current_stream()` and `torch.cuda.current_stream()` are dynamo's ambient stream, index 0; inside a `with` block the current stream is that block's stream."
    def prog(x):
        s = torch.cuda.Stream()
        s.wait_stream(torch.accelerator.current_stream())
        with torch.cuda.stream(s):
            y = x.sin()
            inner = torch.cuda.current_stream()       # s itself
            inner.wait_stream(s)                      # s waits for itself: wait_stream(1, 1)
        torch.cuda.current_stream().wait_stream(s)
        return y * 2
    x = torch.randn(3, requires_grad=True)
    cap = capture(prog, x)
    ops = sync_ops(cap.forward)
    assert ops[0] == ("wait_stream", (1, 0)) and ops[-1] == ("wait_stream", (0, 1))
    assert ("wait_stream", (1, 1)) in ops


def test_record_stream_is_traced_and_eager_runs_it():
    "vLLM/apex: `x.record_stream(s)`; aot_function cannot functionalize it on a CPU, dynamo traces it."
    def prog(x):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            y = x.cos()
        y.record_stream(torch.cuda.current_stream())
        torch.cuda.current_stream().wait_stream(s)
        return y * 3
    x = torch.randn(5, requires_grad=True)
    cap = capture(prog, x)
    assert cap.frontend == "dynamo"
    assert "record_stream" in [op for op, _ in sync_ops(cap.joint)]
    assert_same(cap.process().run(x), eager(prog, x))


def test_module_with_a_stream_made_in_init_explained_both_ways():
    "The MoE shared-expert pattern: explain sees the streams, the default mode partitions, equals eager, no race."
    with cpu_streams():
        model = SharedExpertMoE()
    assert isinstance(model.alt, CPUStream)
    x = torch.randn(6, 16, requires_grad=True)
    ex = streamnb.explain(model, x)
    assert ex.capture.frontend == "dynamo" and ex.capture.streams == {1}
    default = ex.modes["default"]
    assert default.error is None, default.error
    assert default.matches_eager is True
    assert default.report.ok, str(default.report)


def test_cli_explains_a_stream_object_factory(tmp_path):
    "The CLI builds the factory under cpu_streams (the module makes its stream in __init__) and traces it with dynamo."
    from streamnb.cli import main
    f = tmp_path / "moe.py"
    f.write_text(textwrap.dedent('''
        import torch, torch.nn as nn
        class Overlapped(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin, self.s = nn.Linear(8, 8), torch.cuda.Stream()
            def forward(self, x):
                self.s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(self.s):
                    y = torch.tanh(self.lin(x))
                torch.cuda.current_stream().wait_stream(self.s)
                return y.sum()
        def make():
            return Overlapped(), (torch.randn(4, 8, requires_grad=True),)
    '''))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["explain", f"{f}:make", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 0, err.getvalue()
    rows = {line.split()[0]: line.split() for line in out.getvalue().splitlines() if line.startswith(("upstream", "default"))}
    assert rows["default"][4] == "0" and rows["default"][-1] == "True"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err := io.StringIO()):
        rc = main(["explain", f"{f}:make", "--out", str(tmp_path / "o2"), "--frontend", "aot", "--quiet"])
    assert rc == 2 and "AOTAutograd could not trace" in err.getvalue()


def test_cpu_streams_restores_everything_and_steps_aside_on_a_gpu():
    before = (torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream, torch.cuda.current_stream, torch.Stream,
              torch.Event, torch.Tensor.record_stream, torch._C._accelerator_getStream)
    with pytest.raises(ValueError):
        with cpu_streams(eager=True) as cur:
            assert isinstance(cur, CPUStream) and torch.cuda.current_stream() is cur
            s = torch.Stream(device="cuda")                  # a CPU stand-in, whatever the device
            e = torch.cuda.Event()
            assert isinstance(s, CPUStream) and isinstance(e, CPUEvent)
            s.wait_stream(cur); e.record(s); e.wait(); torch.randn(2).record_stream(s)   # all do nothing
            raise ValueError
    after = (torch.cuda.Stream, torch.cuda.Event, torch.cuda.stream, torch.cuda.current_stream, torch.Stream,
             torch.Event, torch.Tensor.record_stream, torch._C._accelerator_getStream)
    assert before == after
    with mock.patch.object(torch.accelerator, "is_available", lambda: True):
        with cpu_streams() as got:
            assert got is None and torch.cuda.Stream is before[0]


def test_aot_only_names_what_it_cannot_do():
    with pytest.raises(TraceError, match="AOTAutograd could not trace fork_join: RuntimeError: torch.cuda.Stream requires CUDA"):
        capture(fork_join, torch.randn(2, 2, requires_grad=True), torch.randn(2, 2), frontend="aot")


def test_stream_calls_dynamo_has_no_rule_for_are_named_with_the_fix():
    """`torch.cuda.set_stream` and `torch.cuda.default_stream` have no dynamo rule in torch 2.13: the error says so, names
    the line of user code and says which calls to use, instead of dynamo's generic "RuntimeError when making fake
    tensor call" and a hint about control flow."""
    def switched(x, w):
        side, cur = torch.cuda.Stream(), torch.cuda.current_stream()
        side.wait_stream(cur)
        torch.cuda.set_stream(side)
        y = x @ w
        torch.cuda.set_stream(cur)
        cur.wait_stream(side)
        return (y * 2).sum()
    def on_default(x, w):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.default_stream())
        with torch.cuda.stream(side): y = x @ w
        return (y * 2).sum()
    for (prog, call), frontend in itertools.product([(switched, "set_stream"), (on_default, "default_stream")],
                                                    ["dynamo", "auto"]):
        with pytest.raises(TraceError) as got:
            capture(prog, torch.randn(2, 2, requires_grad=True), torch.randn(2, 2), frontend=frontend)
        msg = str(got.value)
        assert f"dynamo has no rule for `{call}`" in msg and "with torch.cuda.stream(s):" in msg, msg
        assert f"in {prog.__name__}" in msg and "control flow" not in msg, msg


def test_a_closure_tensor_is_named_not_a_stop_iteration():
    w = torch.randn(3, 3, requires_grad=True)
    def prog(x):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s): y = x @ w
        torch.cuda.current_stream().wait_stream(s)
        return y
    with pytest.raises(streamnb.tracing.CaptureError, match=r"neither an input nor a parameter or buffer \(shape \(3, 3\)"):
        capture(prog, torch.randn(3, 3, requires_grad=True))


def test_explain_judges_the_forward():
    """Issue 27 item 5: a forward race (no join after the side stream's work) was invisible to explain, whose columns
    were the backward's (fails on 5425faa: no `fw_errors`); the joined program has none."""
    def no_join(x, w):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = torch.relu(x @ w)
        return (y * 2).sum()
    def with_join(x, w):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y = torch.relu(x @ w)
        torch.cuda.current_stream().wait_stream(side)
        return (y * 2).sum()
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    bad, good = streamnb.explain(no_join, *xs), streamnb.explain(with_join, *xs)
    assert [r["fw_errors"] for r in good.summary()] == [0, 0, 0]   # before the passes: the forward as written
    # no_join: mul reads relu unordered, and the forward returns relu (saved for the backward) unjoined
    assert [(e.kind, e.nodes) for e in bad.modes["default"].forward_report.errors] == [
        ("race", ("mul", "relu")), ("unjoined_output", ("output", "relu"))]
    assert all(ex.modes["default"].matches_eager is True for ex in (bad, good))
    assert "the forward's syncs are the program's job" in bad.summary_text()
    assert "forward:" not in good.summary_text()
    assert good.modes["default"].forward_timeline.makespan > 0


def test_stream_record_event_without_an_event():
    """`e = side.record_event()`: dynamo asks the real stream for the event, which a CPU stream cannot make (before:
    "cpu backend doesn't support events"). Under cpu_streams it traces as `torch.cuda.Event()` + `e.record()` does, and
    compiles and runs; without the wait the race is named."""
    def prog(x, w, wait=True):
        cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            a = x @ w
            e = side.record_event()
        if wait: e.wait()
        a.record_stream(cur)
        return (a * 2).sum()
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    c = capture(prog, *xs)
    ops = [(n.target.__name__.split(".")[0], n.args) for n in c.forward.graph.nodes if decode(n) is not None]
    assert [(k, a) for k, a in ops if k != "record_stream"] == [("wait_stream", (1, 0)), ("record_event", (2, 1)), ("wait_event", (2, 0))]
    torch.testing.assert_close(c.process().run(*xs), c.eager(*xs))
    assert streamnb.explain(prog, *xs).written.errors == []
    racy = streamnb.explain(lambda x, w: prog(x, w, wait=False), *xs)
    assert ("race", ("mul", "mm")) in [(e.kind, e.nodes) for e in racy.written.errors]
    from test_compile import compile_and_run
    with cpu_streams():
        sw, graphs, out, grads, _ = compile_and_run(prog, xs, cpu_as="meta")
    torch.testing.assert_close(out, c.eager(*xs).outputs)
    assert sw.explain(graphs).reports["forward 0"].errors == []


def test_explain_judges_the_program_as_written():
    """A race the default's processed forward does not have, because a correction-22 `sync_dealloc` happens to order
    it, is still the program's: eager and torch 2.13's compiled forward race. explain said 0 forward errors and nothing
    else (before `Explanation.written`); it now counts the forward as written and says what the default hides."""
    def program(join: bool):
        def prog(x, w):
            cur, s1, s2 = torch.cuda.current_stream(), torch.cuda.Stream(), torch.cuda.Stream()
            s1.wait_stream(cur)
            with torch.cuda.stream(s1):
                a = x @ w
                s2.wait_stream(s1)
                with torch.cuda.stream(s2):
                    b = torch.relu(a)
                c = a + 1
            cur.wait_stream(s1)   # s1 is joined; s2 only if `join`
            if join: cur.wait_stream(s2); a.record_stream(s2); b.record_stream(cur); c.record_stream(cur)
            return (b + c).sum()
        return prog
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    bad, good = streamnb.explain(program(False), *xs), streamnb.explain(program(True), *xs)
    race = ("race", ("add_1", "relu"))
    assert race in [(e.kind, e.nodes) for e in bad.written.errors]
    assert race in [(e.kind, e.nodes) for e in bad.modes["upstream"].forward_report.errors]
    assert bad.modes["default"].forward_report.errors == [] and bad.modes["default"].matches_eager
    assert bad.summary()[0]["fw_errors"] == len(bad.written.errors) > 0
    text = bad.summary_text()
    assert "the program as written has" in text and "fix the program" in text and "data race on tensor relu" in text
    assert good.written.errors == [] and good.forward_note() is None and "as written" not in good.summary_text()


def test_as_written_counts_the_programs_outputs_not_the_saved_values():
    """Eager's backward reads a value saved for it on the stream that made it: only an output the program returns must
    be joined. `relu` is saved for the backward (not returned) in the first program, returned in the second."""
    def saved(x, w):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side): y = torch.relu(x @ w)
        return (y * 2).sum()   # a race, and `relu`, saved for relu's backward, is returned unjoined
    def returned(x, w):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side): y = torch.relu(x @ w)
        return y   # the caller reads it on the current stream
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    got = lambda r: [(e.kind, e.nodes) for e in r.errors]
    cap = capture(saved, *xs)
    assert got(sanitize(cap.forward)) == [("race", ("mul", "relu")), ("unjoined_output", ("output", "relu"))]
    assert got(streamnb.explainer.as_written(cap)) == [("race", ("mul", "relu"))]
    assert got(streamnb.explainer.as_written(capture(returned, *xs))) == [("unjoined_output", ("output", "relu"))]


class OffloadInHooks(torch.nn.Module):
    "torchtune-style activation offloading: saved activations copied to the CPU on a side stream in saved_tensors_hooks."
    def __init__(self, hooks: str = "saved_tensors_hooks"):
        super().__init__()
        self.w, self.side, self.hooks = torch.nn.Parameter(torch.randn(8, 8)), torch.cuda.Stream(), hooks

    def forward(self, x):
        def pack(t):
            with torch.cuda.stream(self.side): return t.to("cpu", non_blocking=True)
        ctx = (torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) if self.hooks == "saved_tensors_hooks"
               else torch.autograd.graph.save_on_cpu())
        with ctx: y = (x @ self.w).relu()
        return y.sum()


@pytest.mark.parametrize("frontend", ["auto", "aot", "dynamo"])
@pytest.mark.parametrize("hooks", ["saved_tensors_hooks", "save_on_cpu"])
def test_saved_tensors_hooks_are_refused_saying_why(frontend, hooks):
    """Before: the aot frontend captured the model without its hooks' stream work (no stream at all) and dynamo said
    'Attempted to inline function marked as skipped'. Now every frontend refuses it and names the hooks."""
    with cpu_streams(): m = OffloadInHooks(hooks)
    with pytest.raises(CaptureError, match=r"uses torch\.autograd\.graph\.\w+: AOTAutograd traces the forward and "
                       r"backward without such hooks") as e:
        capture(m, torch.randn(4, 8, requires_grad=True), frontend=frontend)
    assert "streamnb cannot judge it" in str(e.value)


def test_a_query_is_named_in_a_note():
    """`Stream.query()` and `Event.query()` depend on timing, and dynamo bakes the answer it got while tracing into the
    graph: explain must say that the program it judged keeps one branch, naming each call's line once."""
    def polls(x, w):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            y = torch.relu(x @ w)
            done = torch.cuda.Event()
            done.record()
        idle = side.query()
        if idle and done.query() and done.query(): return (y * 2).sum()
        return y.sum()
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    text = streamnb.explain(polls, *xs).summary_text()
    assert "judged on one side only" in text, text
    (note,) = capture(polls, *xs).notes
    first = polls.__code__.co_firstlineno
    assert f"line {first + 6} of polls (idle = side.query())" in note, note
    assert note.count(f"line {first + 7} of polls (if idle and done.query()") == 1, note   # two calls, one line


def test_a_copy_this_machine_cannot_see_is_named_in_a_note():
    """`h.to("cpu", non_blocking=True)` of a CPU tensor is no copy: the graph has no node for it, so a clean verdict
    would be about a program without the copy. The note names the line; a dtype change and a blocking copy get none."""
    def offload(x, w):
        side = torch.cuda.Stream()
        h = torch.relu(x @ w)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            saved = h.to("cpu", non_blocking=True)
            half = h.to(torch.float16)
        return (h * 2).sum() + saved.sum() + half.sum()
    def blocking(x, w):
        side = torch.cuda.Stream()
        h = torch.relu(x @ w)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            saved = h.to("cpu")
        return (h * 2).sum() + saved.sum()
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    first = offload.__code__.co_firstlineno
    copies = [n for n in capture(offload, *xs).notes if "non_blocking=True" in n]
    assert len(copies) == 1 and f"line {first + 5} of offload (saved = h.to(" in copies[0], copies
    assert "copies with non_blocking=True" in streamnb.explain(offload, *xs).summary_text()
    assert not [n for n in capture(blocking, *xs).notes if "non_blocking" in n]


def test_compiled_programs_get_dynamo_notes_too():
    "Through `torch.compile` with `executor_backend`, `sw.explain` prints what only dynamo's graph showed (a query)."
    from streamnb.compiling import executor_backend, use_streamnb_passes
    def polls(x, w):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            y = torch.relu(x @ w)
        torch.cuda.current_stream().wait_stream(side)
        return (y * 2).sum() if side.query() else y.sum()
    torch._dynamo.reset()
    graphs: dict = {}
    with use_streamnb_passes(cpu_as="meta") as sw, cpu_streams():
        torch.compile(polls, backend=executor_backend(graphs))(torch.randn(4, 4, requires_grad=True),
                                                              torch.randn(4, 4, requires_grad=True)).backward()
    cx = sw.explain(graphs)
    assert len(cx.notes) == 1 and f"line {polls.__code__.co_firstlineno + 5} of polls" in cx.notes[0], cx.notes
    assert "judged on one side only" in cx.summary_text()
    assert all(g.meta["streamnb_notes"] == cx.notes for gms in graphs.values() for g in gms)


def _function(body):
    "An `x @ w` autograd.Function whose backward is `body(x, w, g) -> (gx, gw)`."
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w
        @staticmethod
        def backward(ctx, g):
            return body(*ctx.saved_tensors, g)
    return F


def _no_wait(x, w, g):   # the side stream reads x and g without waiting for the Function's stream
    cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
    with torch.cuda.stream(side): gw = x.t() @ g
    gx = g @ w.t()
    cur.wait_stream(side); gw.record_stream(cur)
    return gx, gw


def _all_on_side(x, w, g):
    with torch.cuda.stream(torch.cuda.Stream()): return g @ w.t(), x.t() @ g


def _synced(x, w, g):
    cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side): gw = x.t() @ g
    gx = g @ w.t()
    cur.wait_stream(side); gw.record_stream(cur)
    return gx, gw


@pytest.mark.parametrize("applied", ["current", "side"])
def test_custom_backward_as_written(applied):
    """Eager's autograd engine runs a Function's backward on the stream its forward ran on; the streams inside are the
    program's. The default's compiled backward is clean in every case (its passes add the syncs), so before
    `custom_backward_as_written` explain said nothing of a custom backward that races in eager."""
    def program(body):
        fn = _function(body)
        def prog(x, w):
            if applied == "current": return torch.relu(fn.apply(x, w)).sum()
            cur, s = torch.cuda.current_stream(), torch.cuda.Stream()
            s.wait_stream(cur)
            with torch.cuda.stream(s): y = fn.apply(x, w)   # the backward then runs on s
            cur.wait_stream(s); y.record_stream(cur)
            return torch.relu(y).sum()
        return prog
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    got = {b.__name__: streamnb.explain(program(b), *xs) for b in (_no_wait, _all_on_side, _synced)}
    assert all(ex.modes["default"].report.errors == [] for ex in got.values())
    kinds = lambda ex: [(e.kind, e.nodes) for e in ex.written_backward.errors]
    assert kinds(got["_no_wait"]) == [("race", ("mm_1", "primals_1")), ("race", ("mm_1", "threshold_backward"))]
    assert "custom autograd.Function backward(s) as written have 2" in got["_no_wait"].summary_text()
    assert kinds(got["_synced"]) == [] and got["_synced"].backward_note() is None
    side = got["_all_on_side"]
    if applied == "current":   # the forward has no side stream: the Function ran on the current one
        assert ("unjoined_output", ("output", "mm_1")) in kinds(side) and not side.backward_unjudged
    else:   # on s, or on the current stream with the whole backward on a side stream: the graph does not say
        assert kinds(side) == [] and len(side.backward_unjudged) == 1 and "not judged" in side.backward_note()


def test_a_function_outside_its_module_is_named():
    """Code run with exec (nbdev_test, a runner) defines an autograd.Function outside the module it names; dynamo's
    guard then fails to find it (`module '__main__' has no attribute 'F'`). The error says why and what to do."""
    src = textwrap.dedent('''
        import torch
        class Exec(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x): return x * 2
            @staticmethod
            def backward(ctx, g):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side): r = g * 2
                torch.cuda.current_stream().wait_stream(side)
                return r
        def prog(x): return Exec.apply(x).sum()
    ''')
    # (not `__main__` itself: dynamo caches the module it first imports under a name, for the whole process)
    empty = "streamnb_test_empty_module"
    scope = {"__name__": empty}
    exec(src, scope)
    with mock.patch.dict(sys.modules, {empty: types.ModuleType(empty)}), pytest.raises(
            TraceError, match=re.escape(f"dynamo looks `Exec` up as `{empty}.Exec` (the module it names)") +
            ".*define it in a module the program imports"):
        capture(scope["prog"], torch.randn(3, requires_grad=True))


with cpu_streams(eager=True): _READY = torch.cuda.Event()   # recorded by the caller, before the program runs


def _waits_for_the_caller(x, w):
    torch.cuda.current_stream().wait_event(_READY)   # e.g. a prefetcher's copy of the batch
    return (x @ w).sum()


def _host_waits_for_the_caller(x, w):
    _READY.synchronize()
    return (x @ w).sum()


@pytest.mark.parametrize("prog", [_waits_for_the_caller, _host_waits_for_the_caller])
def test_a_forward_sync_on_an_event_recorded_by_the_caller(prog):
    """Correction 12 orders such a sync after the graph's inputs. In a joint graph those were every placeholder, the
    tangents too: the forward `control_deps` then read a backward input, and AOTAutograd's partitioner rejected the
    default's graph ("Node sum_1 was invalid, but is output"). Now a forward sync follows the forward's inputs only.
    The seed wraps the wait after its stream's nodes only (it partitions), and its `synchronize_event` after every
    placeholder (it does not)."""
    xs = (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True))
    ex = streamnb.explain(prog, *xs)
    de, up = ex.modes["default"], ex.modes["upstream"]
    assert (de.error, de.matches_eager) == (None, True)
    ctrl = next(n for n in de.forward.graph.nodes if n.target is torch.ops.higher_order.control_deps)
    assert [d.name for d in ctrl.args[0]] == ["primals_1", "primals_2"]
    seed_fails = prog is _host_waits_for_the_caller
    assert (up.error is not None) == seed_fails and (not seed_fails or "invalid, but is output" in up.error)
    from test_compile import compile_and_run   # and through torch.compile, as a user compiles it
    with cpu_streams(): _, _, out, grads, _ = compile_and_run(prog, xs, cpu_as="meta")
    want = ex.capture.eager(*xs)
    torch.testing.assert_close((out, grads), (want.outputs, list(want.grads)))
