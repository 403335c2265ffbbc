"""Issue 46, item 6: the device-generic API (`torch.Stream`, `torch.Event`, `torch.accelerator.current_stream()`) works on
a CPU wherever `torch.cuda` streams do: under `cpu_streams()` (stand-ins for `torch.Stream`/`torch.Event` whatever device
they name), through capture, `explain`, the CLI and the compile switch, giving what the same program written with
`torch.cuda` streams gives. A stream made outside the stand-ins (a real CPU stream: a CPU has no events) fails with one
line that says what to write instead."""
import warnings

import pytest
import torch

import streamnb
from streamnb.capturing import capture, eager
from streamnb.cli import main
from streamnb.cpustreams import CPUEvent, CPUStream, cpu_streams
from streamnb.graph import canonical
from streamnb.tracing import CaptureError, TraceError

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
pytestmark = pytest.mark.skipif(torch.accelerator.is_available(), reason="cpu_streams steps aside on an accelerator")


class API:
    "One program, two spellings: `generic` (torch.Stream, torch.Event, torch.accelerator) or `torch.cuda`'s."
    def __init__(self, generic: bool): self.generic = generic
    def stream(self, **kw): return torch.Stream(device="cuda", **kw) if self.generic else torch.cuda.Stream(**kw)
    def event(self): return torch.Event() if self.generic else torch.cuda.Event()
    def current(self): return torch.accelerator.current_stream() if self.generic else torch.cuda.current_stream()
    def ctx(self, s): return s if self.generic else torch.cuda.stream(s)   # a torch.Stream is its own context manager


class SideBlock(torch.nn.Module):
    """A linear layer, then a block on a side stream made in `__init__`. `join`: how the current stream waits for it
    (`event`: e.record(side), e.wait(cur); `wait_event`: cur.wait_event(side.record_event()); `wait_stream`; `none`: a race)."""
    def __init__(self, generic: bool, join: str = "event"):
        super().__init__()
        self.api, self.join = API(generic), join
        self.lin = torch.nn.Linear(8, 8)
        self.side = self.api.stream(priority=-1)

    def forward(self, x):
        api, side = self.api, self.side
        cur = api.current()
        h = self.lin(x)
        side.wait_stream(cur)
        with api.ctx(side):
            a = h.sin() * h
        if self.join == "event":
            ev = api.event(); ev.record(side); ev.wait(cur)
        elif self.join == "wait_event": cur.wait_event(side.record_event())
        elif self.join == "wait_stream": cur.wait_stream(side)
        return (a + h).sum()


class MadeInForward(torch.nn.Module):
    "Streams and events made inside `forward` (dynamo makes them at trace time and again in the compiled code)."
    def __init__(self, generic: bool):
        super().__init__()
        self.api = API(generic)
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        api = self.api
        cur, s1, s2 = api.current(), api.stream(), api.stream()
        s1.wait_stream(cur); s2.wait_stream(cur)
        with api.ctx(s1): a = x @ self.w
        with api.ctx(s2): b = (x * 2).relu()
        e1, e2 = api.event(), api.event()
        e1.record(s1); e2.record(s2)
        cur.wait_event(e1); e2.wait(cur)
        return (a * b).sum()


PROGRAMS = {   # name -> (module class, kwargs, input needs grad)
    "event": (SideBlock, dict(join="event"), True),
    "wait_event": (SideBlock, dict(join="wait_event"), True),
    "wait_stream": (SideBlock, dict(join="wait_stream"), True),
    "racy": (SideBlock, dict(join="none"), True),
    "made_in_forward": (MadeInForward, {}, True),
    "inference": (SideBlock, dict(join="event"), False),
}


def build(name, generic):
    cls, kw, grad = PROGRAMS[name]
    torch.manual_seed(0)
    return cls(generic, **kw), (torch.randn(4, 8, requires_grad=grad),)


def explained(name, generic):
    with cpu_streams():
        m, xs = build(name, generic)
        return streamnb.explain(m, *xs)


def findings(rep):
    return [(e.kind, e.nodes) for e in rep.errors + rep.warnings] if rep is not None else None


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_explain_gives_what_the_torch_cuda_program_gives(name):
    got, want = explained(name, True), explained(name, False)
    assert got.capture.streams and got.summary() == want.summary()
    assert canonical(got.capture.forward) == canonical(want.capture.forward)
    if not got.capture.inference: assert canonical(got.capture.backward) == canonical(want.capture.backward)
    assert findings(got.written) == findings(want.written)
    assert ("race" in got.written.kinds) == (name == "racy")
    assert got.modes["default"].matches_eager   # (the summary holds each mode's, equal to the torch.cuda program's)
    for mode, r in got.modes.items():
        assert findings(r.forward_report) == findings(want.modes[mode].forward_report), mode


def test_the_stand_ins_make_cpu_objects_whatever_device_they_name():
    with cpu_streams(eager=True) as cur:
        s, e = torch.Stream(device="cuda", priority=-1), torch.Event(device="cuda", enable_timing=True)
        assert type(s) is CPUStream and type(e) is CPUEvent and s.device.type == "cpu"
        assert isinstance(s, torch.Stream) and isinstance(e, torch.Event) and issubclass(CPUStream, torch.Stream)
        assert isinstance(cur, torch.Stream) and not isinstance(e, torch.Stream)
        assert torch.accelerator.current_stream() is cur
        with s: s.wait_stream(cur); e.record(s); e.wait(cur); s.record_event().synchronize()   # all do nothing
    assert torch.Stream is torch._C.Stream and torch.Event is torch._C.Event       # torch's own names are back


@pytest.mark.parametrize("name", ["event", "made_in_forward"])
def test_capture_and_run_equal_eager(name):
    with cpu_streams():
        m, xs = build(name, True)
        c = capture(m, *xs)
    torch.testing.assert_close(c.process().run(*xs), eager(m, *xs))


def test_the_cli_writes_what_it_writes_for_the_torch_cuda_program(tmp_path, capsys):
    src = {}
    for generic in (True, False):
        f = tmp_path / f"prog_{generic}.py"
        f.write_text(f"import torch\nfrom test_device_generic import SideBlock\n"
                     f"def factory(): torch.manual_seed(0); return SideBlock({generic}), (torch.randn(4, 8, requires_grad=True),)\n")
        assert main(["explain", f"{f}:factory", "--out", str(tmp_path / f"out_{generic}"), "--quiet"]) == 0
        src[generic] = {p.name: p.read_bytes() for p in (tmp_path / f"out_{generic}").iterdir() if p.suffix in (".txt", ".py")}
    assert src[True] == src[False] and "summary.txt" in src[True]


@pytest.mark.parametrize("name", ["event", "racy"])
def test_the_compile_switch_gives_what_the_torch_cuda_program_gives(name):
    from test_compile import compile_and_run
    res = {}
    for generic in (True, False):
        with cpu_streams():
            m, xs = build(name, generic)
            sw, graphs, out, grads, pgrads = compile_and_run(m, xs, cpu_as="meta")
            rep = sw.explain(graphs)
        res[generic] = (out, grads, pgrads, {k: findings(r) for k, r in rep.reports.items()},
                        {k: [canonical(g) for g in gs] for k, gs in graphs.items()})
        want = eager(m, *xs)
        torch.testing.assert_close(out, want.outputs)
        for n, g in pgrads.items(): torch.testing.assert_close(g, want.param_grads[n])
    torch.testing.assert_close(res[True][:3], res[False][:3])
    assert res[True][3:] == res[False][3:]
    assert any("race" in [k for k, _ in f] for f in res[True][3].values()) == (name == "racy")


def test_a_stream_made_outside_the_stand_ins_is_one_clear_line():
    # a module built before `with cpu_streams():` holds a real CPU torch.Stream: it traces, but running it eagerly needs
    # events a CPU does not have. One line says what to do, never torch's raw "cpu backend doesn't support events"
    m, xs = SideBlock.__new__(SideBlock), (torch.randn(4, 8, requires_grad=True),)
    torch.nn.Module.__init__(m)
    m.api, m.join, m.lin, m.side = API(True), "event", torch.nn.Linear(8, 8), torch.Stream()   # (device "cpu")
    with cpu_streams(), pytest.raises(CaptureError) as got:
        streamnb.explain(m, *xs)
    msg = str(got.value)
    assert "\n" not in msg and "inside `with streamnb.cpu_streams():`" in msg and "doesn't support events" not in msg


@pytest.mark.parametrize("generic", [True, False])
def test_set_stream_is_refused_naming_the_context_manager(generic):
    # torch 2.13's dynamo has no rule for set_stream, with either spelling: the error names what to write instead
    def prog(x):
        cur, side = API(generic).current(), API(generic).stream()
        side.wait_stream(cur)
        (torch.accelerator.set_stream if generic else torch.cuda.set_stream)(side)
        y = x.sin()
        (torch.accelerator.set_stream if generic else torch.cuda.set_stream)(cur)
        cur.wait_stream(side)
        return y.sum()
    with cpu_streams(), pytest.raises(TraceError, match=r"no rule for `set_stream`.*switch streams with `with torch\.cuda\.stream\(s\):`"):
        capture(prog, torch.randn(4, requires_grad=True))
