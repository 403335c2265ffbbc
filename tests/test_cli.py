"""`streamnb explain FILE.py:FACTORY` (issue 12, item 6): the same outputs as `streamnb demo`; one clear line and exit
status 2 for a wrong path, a missing factory or a factory that raises."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from streamnb.cli import FactoryError, load_factory, main

pytestmark = pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.:FutureWarning")

FACTORIES = '''
import torch
from streamnb.examples import transformer_block_example, make_model
def factory(): return transformer_block_example()
def small(): return make_model("two_branch_mlp")
def one_tensor():
    model, (x,) = make_model("side_stream_consumer"); return model, x
def broken(): raise ValueError("no weights here")
def wrong(): return 42
def not_tensors(): return torch.nn.Linear(2, 2), (3,)
def quits(): import sys; sys.exit(0)
class Stop(BaseException): pass
def stops(): raise Stop("from user code")
class NegativeStream(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.w = torch.nn.Parameter(torch.randn(4, 4))
    def forward(self, x):
        with torch.fx.traceback.annotate({"stream": -1}): y = x @ self.w
        return y.sin()
def negative_stream(): return NegativeStream(), (torch.randn(2, 4),)
'''


@pytest.fixture
def src(tmp_path) -> Path:
    p = tmp_path / "my_model.py"
    p.write_text(FACTORIES)
    return p


def error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("streamnb: error: ") and "Traceback" not in err
    return err.strip()


def test_explain_writes_what_demo_writes(src, tmp_path, capsys):
    demo, mine = tmp_path / "demo", tmp_path / "mine"
    assert main(["demo", "--out", str(demo), "--quiet"]) == 0
    demo_stdout = capsys.readouterr().out
    assert main(["explain", f"{src}:factory", "--out", str(mine), "--quiet"]) == 0
    assert capsys.readouterr().out == demo_stdout
    names = sorted(p.name for p in demo.iterdir())
    assert sorted(p.name for p in mine.iterdir()) == names and len(names) == 14
    for n in names:
        if n.endswith(".png"): assert (mine / n).stat().st_size > 0
        else: assert (mine / n).read_bytes() == (demo / n).read_bytes(), n
    written = (mine / "sanitizer_as_written.txt").read_text()   # the demo's block marks regions and writes no sync
    assert written.startswith("forward, as written (what eager runs):") and "18 error(s)" in written, written[-300:]
    assert written.count("data race on graph input") == 13   # its annotate regions read the inputs (chapter 02, the edges)


def test_explain_small_model_and_a_bare_tensor(src, tmp_path, capsys):
    assert main(["explain", f"{src}:small", "--out", str(tmp_path / "a"), "--quiet", "--device", "A100"]) == 0
    assert "mode" in capsys.readouterr().out and (tmp_path / "a" / "summary.txt").exists()
    model, inputs = load_factory(f"{src}:one_tensor")
    assert isinstance(inputs, tuple) and len(inputs) == 1


def test_user_errors(src, tmp_path, capsys):
    out = ["--out", str(tmp_path / "o"), "--quiet"]
    assert "nope.py: no such file" in error_line(capsys, ["explain", f"{tmp_path}/nope.py:factory", *out])
    assert "has no function 'make' (it defines factory, small" in error_line(capsys, ["explain", f"{src}:make", *out])
    assert "broken() raised ValueError: no weights here" in error_line(capsys, ["explain", f"{src}:broken", *out])
    assert "expected FILE.py:FACTORY" in error_line(capsys, ["explain", str(src), *out])
    assert "must return (model, inputs), got int" in error_line(capsys, ["explain", f"{src}:wrong", *out])
    assert "a tuple of tensors" in error_line(capsys, ["explain", f"{src}:not_tensors", *out])
    bad = tmp_path / "bad.py"
    bad.write_text("import not_a_module_anywhere\n")
    assert "importing it raised ModuleNotFoundError" in error_line(capsys, ["explain", f"{bad}:factory", *out])
    assert "quits() called sys.exit(0): a model file must not exit" in error_line(capsys, ["explain", f"{src}:quits", *out])
    assert "stops() raised Stop: from user code" in error_line(capsys, ["explain", f"{src}:stops", *out])
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(0)\n")
    assert "importing it called sys.exit(0)" in error_line(capsys, ["explain", f"{exits}:factory", *out])
    assert not (tmp_path / "o").exists()
    with pytest.raises(FactoryError): load_factory(f"{src}:broken")


def test_a_graph_that_cannot_run_is_an_error(src, tmp_path, capsys):
    # stream -1 names no stream: before, `explain` exited 0 on it
    line = error_line(capsys, ["explain", f"{src}:negative_stream", "--out", str(tmp_path / "o"), "--quiet"])
    assert "stream annotation -1 is not a stream index" in line and "node " in line


def test_command_line_exit_status(src, tmp_path):
    "As a user runs it: one line on stderr, status 2."
    exe = Path(sys.executable).parent / "streamnb"
    if not exe.exists(): pytest.skip("the streamnb console script is not installed next to this python")
    r = subprocess.run([str(exe), "explain", f"{src}:broken", "--out", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"streamnb: error: {src}:broken: broken() raised ValueError: no weights here"]


def test_assign_demo_and_a_users_model(src, tmp_path, capsys):
    "`streamnb assign` (issue 13 item 6): the table of the four assignments, and the timelines written per strategy."
    out = tmp_path / "assign"
    assert main(["assign", "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["model", "strategy"]
    assert [ln.split()[1] for ln in lines[2:]] == ["single", "critical_path", "nimble", "streamnb"]
    assert all(ln.split()[0] == "transformer_block" and ln.split()[-1] == "ok" for ln in lines[2:])
    names = sorted(p.name for p in out.iterdir())
    assert names == ["table.txt", "timelines.png", "trace_critical_path.json", "trace_nimble.json", "trace_single.json",
                     "trace_streamnb.json"]
    assert (out / "table.txt").read_text().splitlines() == lines
    import json
    trace = json.loads((out / "trace_streamnb.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    mine = tmp_path / "mine"
    assert main(["assign", f"{src}:small", "--out", str(mine), "--quiet", "--side-streams", "1", "--device", "A100"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert len(rows) == 4 and all(r.split()[0] == "my_model.py:small" for r in rows)
    assert max(int(r.split()[2]) for r in rows) <= 2          # one side stream at most
    assert "--side-streams -1: must be >= 0" in error_line(capsys, ["assign", "--side-streams", "-1", "--out", str(mine)])
    assert "nope.py: no such file" in error_line(capsys, ["assign", f"{tmp_path}/nope.py:f", "--out", str(mine), "--quiet"])


def test_demo_timeline_says_why_the_two_modes_look_the_same():
    """`streamnb demo`'s timeline.png (`Explanation.plot_timelines`): the transformer block's two processed backwards
    have the same schedule, so one panel shows both and its title names where they differ (issue 25); a different
    schedule gets a panel per mode."""
    import copy
    import matplotlib
    matplotlib.use("Agg")
    from streamnb.examples import transformer_block_example
    from streamnb.explainer import explain
    model, inputs = transformer_block_example()
    ex = explain(model, *inputs, device="H100", check=False)
    assert ex.same_schedule()
    fig = ex.plot_timelines()
    titles = [a.get_title(loc="left") for a in fig.axes]
    assert len(titles) == 2 and titles[0].startswith("before the passes")
    fig.canvas.draw()   # the saying-why title is whole: broken into lines, never cut at the figure's right edge
    for a, t in zip(fig.axes, titles):
        shown = next(x for x in a.get_children() if hasattr(x, "get_text") and x.get_text() == t)
        assert shown.get_window_extent().x1 <= fig.bbox.x1, f"title runs off timeline.png: {t!r}"
    assert titles[1].startswith("upstream and default passes: the same schedule; they differ only")
    up, de = ex.modes["upstream"], ex.modes["default"]
    assert len(up.reorder_report.errors) != len(de.reorder_report.errors) and "under reordering" in titles[1]
    other = copy.copy(ex); other.modes = dict(ex.modes)
    shifted = copy.copy(up.timeline)
    shifted.spans = {n: (s, a + 0.001, b + 0.001) for n, (s, a, b) in up.timeline.spans.items()}
    other.modes["upstream"] = copy.copy(up); other.modes["upstream"].timeline = shifted
    assert not other.same_schedule()
    titles = [a.get_title(loc="left") for a in other.plot_timelines().axes]
    assert [t.split(" (")[0] for t in titles] == ["before the passes", "upstream passes", "default passes"]


DEVICE_GENERIC = '''
import torch
class M(torch.nn.Module):
    "Written with the device-generic API: torch.Stream, torch.Event, torch.accelerator.current_stream()."
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(8, 8); self.side = torch.Stream()
    def forward(self, x):
        cur = torch.accelerator.current_stream()
        self.side.wait_stream(cur)
        with self.side:
            h = self.lin(x).relu()
        ev = torch.Event()
        ev.record(self.side)
        cur.wait_event(ev)
        return h.sum()
def factory(): return M(), (torch.randn(4, 8),)
'''


def test_the_device_generic_api_on_a_cpu(tmp_path, capsys):
    # issue 46: the CLI makes the module under cpu_streams, whose stand-ins cover torch.Stream/torch.Event: the
    # device-generic program gives what the same program written with torch.cuda streams gives (before: a failure).
    # A module made outside the stand-ins (a real CPU stream, no events) fails in explain with one line saying what to do.
    from streamnb.capturing import CaptureError, cpu_streams
    from streamnb.explainer import explain
    cuda = DEVICE_GENERIC.replace("torch.Stream()", "torch.cuda.Stream()").replace("torch.Event()", "torch.cuda.Event()")
    cuda = cuda.replace("torch.accelerator.current_stream()", "torch.cuda.current_stream()")
    written = {}
    for name, text in (("generic", DEVICE_GENERIC), ("cuda", cuda)):
        src = tmp_path / f"{name}.py"; src.write_text(text)
        assert main(["explain", f"{src}:factory", "--out", str(tmp_path / name), "--quiet"]) == 0
        written[name] = {p.name: p.read_text() for p in (tmp_path / name).glob("*.txt")}
    assert written["generic"] == written["cuda"] and "summary.txt" in written["cuda"]
    ns: dict = {}
    exec(compile(DEVICE_GENERIC, str(tmp_path / "generic.py"), "exec"), ns)
    m, xs = ns["factory"]()   # (outside cpu_streams: its torch.Stream() is a real CPU stream)
    with cpu_streams(), pytest.raises(CaptureError, match=r"inside `with streamnb\.cpu_streams\(\):`") as got:
        explain(m, *xs)
    assert "\n" not in str(got.value) and "doesn't support events" not in str(got.value)