"""Forward-only (inference) programs are captured, explained, drawn, run through the command and compiled as training
programs are (issue 45, item 3 and the inference half of item 5; issue 46, items 2, 3 and the inference half of 7):
`capture` of a program with no gradient is its inference graph with no backward, `Capture.process` runs what each mode
runs on an inference graph (the same as the `torch.compile` switch), and `explain`, the CLI, the pictures and
`switch.explain(graphs)` judge it the same way."""
import contextlib
import io
import warnings
from collections import Counter
from pathlib import Path

import pytest

import torch

from streamnb.examples import inference_fn
from streamnb.capturing import FORWARD_ONLY_PASSES, capture, eager, forward_only_passes
from streamnb.choosing import assign_streams
from streamnb.cli import main
from streamnb.compiling import executor_backend, explain_compiled, use_streamnb_passes
from streamnb.cpustreams import cpu_streams
from streamnb.explainer import explain
from streamnb.graph import StreamnbError, get_stream
from streamnb.inference import PROGRAMS, CommOverlap, build_inference, compile_inference
from streamnb.patterns import STYLES
from streamnb.streamops import decode
from streamnb.tracing import NoGradError

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def objects(record: bool = True, join: bool = True):
    "x @ w on a side stream, read on the current stream; `record`: h.record_stream(cur); `join`: cur waits for side."
    def f(x, w):
        cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
        y = x.sin()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            h = (y @ w).relu()
        if join: cur.wait_stream(side)
        if record: h.record_stream(cur)
        return h + y
    return f


XS = lambda: (torch.randn(8, 8), torch.randn(8, 8))


def ops(gm) -> Counter:
    return Counter(str(op.kind) for n in gm.graph.nodes if (op := decode(n, gm)) is not None)


def verdicts(report) -> list:
    return sorted(e.kind for e in report.errors)


# --- capture -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["nothing requires grad", "no_grad", "inference_mode"])
def test_capture_of_a_program_with_no_gradient(how):
    x, w = XS()
    grad = how != "nothing requires grad"
    ctx = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(how, contextlib.nullcontext)
    with ctx():
        a = capture(inference_fn, x, w.requires_grad_(grad), frontend="aot")
        with cpu_streams(): d = capture(objects(), x, w, frontend="dynamo")
    for c, frontend in ((a, "aot"), (d, "dynamo")):
        assert c.inference and c.backward is None and c.joint is c.forward and c.frontend == frontend
        assert "forward only: no backward" in repr(c)
        assert "forward only" in c.notes[0] and "backward passes do not apply" in c.notes[0]
        assert ("grad mode is off" in c.notes[0]) is grad
        assert c.streams == {1}
    assert a.owned_streams == {1} and not d.owned_streams     # annotate: the compiler's; a stream object: the program's
    # aot_function keeps the annotate regions of an inference trace (capture asks it to preserve node meta)
    assert {n.name for n in a.forward.graph.nodes if get_stream(n) == 1} == {"mm", "relu"}


def test_run_and_eager_give_outputs_and_no_grads():
    x, w = XS()
    with cpu_streams(), torch.no_grad(): c = capture(objects(), x, w)
    for p in (c, c.process(upstream=True), c.process()):
        got, want = p.run(x, w), p.eager(x, w)
        torch.testing.assert_close(got.outputs, want.outputs)
        assert got.grads == want.grads == (None, None) and got.param_grads == want.param_grads == {}
    with pytest.raises(NoGradError, match="forward only"): c.run(x, w, grad_outputs=[torch.ones(8, 8)])
    with pytest.raises(StreamnbError, match="already processed"): c.process().process()
    # a module: its parameters' grads are None too
    m = torch.nn.Linear(8, 8)
    with torch.no_grad(): cm = capture(m, x)
    assert cm.run(x).param_grads == cm.eager(x).param_grads == {"weight": None, "bias": None}


def test_process_upstream_runs_what_aotautograd_runs_on_an_inference_graph():
    c = capture(inference_fn, *XS())
    up, de = c.process(upstream=True), c.process()
    assert up.forward.meta["streamnb_passes"] == [p for p in FORWARD_ONLY_PASSES if p != "populate_fw_metadata_with_stream_indices"]
    assert de.forward.meta["streamnb_passes"] == ["assign_epilogue_copy_streams", "sync_deallocations",
                                                  "wrap_all_sync_nodes_with_control_deps"]
    assert ops(up.forward) == Counter()                              # the seed: no sync in a forward
    assert ops(de.forward)["wait_event"] > 0 and ops(de.forward)["sync_dealloc"] > 0
    assert c.forward.meta.get("streamnb_passes") is None             # the capture itself is untouched
    with pytest.raises(StreamnbError, match="seed syncs the backward only"): c.process(upstream=True, forward_syncs=True)
    with pytest.raises(StreamnbError, match="seed syncs the backward only"):
        forward_only_passes(c.forward, upstream=True, forward_syncs=True)


@pytest.mark.parametrize("kind", ["annotate", "objects"])
def test_capture_default_is_what_the_switch_does_to_an_inference_graph(kind):
    # one rule for both places: the processed capture and the compiled graph have the same passes, syncs and verdicts
    fn = inference_fn if kind == "annotate" else objects(record=False)
    xs = XS()
    with cpu_streams(), torch.no_grad():
        de = capture(fn, *xs).process()
        graphs = {}
        torch._dynamo.reset()
        with use_streamnb_passes(cpu_as="meta") as sw:
            out = torch.compile(fn, backend=executor_backend(graphs), fullgraph=True)(*xs)
        torch._dynamo.reset()
    fw = graphs["forward"][0]
    assert fw.meta["streamnb_passes"] == de.forward.meta["streamnb_passes"]
    assert ops(fw) == ops(de.forward)
    assert verdicts(sw.explain(graphs).reports["forward 0"]) == verdicts(explain(fn, *xs).modes["default"].forward_report) == []
    torch.testing.assert_close(out, de.run(*xs).outputs)


# --- corrections 24 and 25 through capture and explain --------------------------------------------------------------

def test_correction_24_through_explain_annotate_regions_get_forward_syncs():
    ex = explain(inference_fn, *XS())
    up, de = ex.modes["upstream"].forward_report, ex.modes["default"].forward_report
    assert ("race", ("mm", "sin")) in [(e.kind, e.nodes) for e in up.errors] and de.errors == []


def test_correction_25_through_capture_and_explain_inference_frees_protected():
    # issue 46, item 3: h is made on the side stream and last read on the current one, with no record_stream
    with cpu_streams(), torch.no_grad(): ex = explain(objects(record=False), *XS())
    up, de = ex.modes["upstream"], ex.modes["default"]
    assert verdicts(ex.written) == verdicts(up.forward_report) == ["unsafe_reuse"]   # the program's, and the seed's
    assert de.forward_report.errors == [] and ops(de.forward)["sync_dealloc"] >= 1
    assert ops(up.forward)["sync_dealloc"] == 0
    assert "correction 25" in ex.summary_text()


# --- explain, pictures, the command ------------------------------------------------------------------------------

def test_explain_says_the_backward_passes_do_not_apply():
    with cpu_streams(), torch.no_grad(): ex = explain(objects(), *XS())
    rows = ex.summary()
    assert [r["mode"] for r in rows] == ["before passes", "upstream", "default"]
    assert {r["errors"] for r in rows} == {None} and {r["partitions"] for r in rows} == {None}
    assert [r["fw_errors"] for r in rows] == [0, 0, 0] and [r["matches_eager"] for r in rows[1:]] == [True, True]
    text = ex.summary_text()
    assert "forward only" in text and "backward passes" in text and "do not apply" in text
    for r in ex.modes.values():
        assert r.backward is None and r.timeline is r.forward_timeline and r.report is r.forward_report
    assert ex.written_backward is None
    # the pictures: the forward's timelines, titled so
    fig = ex.plot_timelines()
    titles = [a.get_title(loc="left") for a in fig.axes if a.get_title(loc="left")]
    assert titles and all(t.startswith("forward only") for t in titles)
    assert ex.before.spans["mm"][0] == 1 and ex.before.spans["sin"][0] == 0   # the forward, drawn on its streams
    ex.plot_forward(); ex.plot_memory()
    with contextlib.redirect_stdout(io.StringIO()) as out:
        from streamnb.explainer import show_explanation
        show_explanation(ex)
    assert "the forward: no backward" in out.getvalue()


def test_forward_syncs_and_the_programs_own_missing_join():
    xs = XS()
    with cpu_streams(), torch.no_grad():
        ex = explain(objects(join=False), *xs)
        fixed = explain(objects(join=False), *xs, forward_syncs=True)
    de = ex.modes["default"].forward_report
    assert "race" in verdicts(de) and "race" in verdicts(ex.written)             # named: the program's own bug
    assert "the program's own streams" in ex.summary_text() and "forward_syncs=True" in ex.summary_text()
    assert fixed.modes["default"].forward_report.errors == [] and fixed.modes["default"].matches_eager
    assert "everywhere (forward_syncs=True)" in fixed.summary_text()


def test_assign_streams_on_an_inference_forward():
    def plain(x, w):
        a, b = (x @ w).relu(), (x * 2).sin()
        return a + b
    c = capture(plain, torch.randn(64, 64), torch.randn(64, 64))
    assert c.inference and c.streams == set()
    gm = assign_streams(c.forward, side_streams=1)
    assert gm.meta["streamnb_assignment"]["part"] == "forward"
    for strategy in ("single", "critical_path", "nimble"):
        assign_streams(capture(plain, torch.randn(64, 64), torch.randn(64, 64)).forward, strategy=strategy)


def test_cli_explain_and_assign_a_program_with_no_gradient(tmp_path):
    src = tmp_path / "tp.py"
    src.write_text("import torch\nfrom streamnb.inference import CommOverlap\n"
                   "def make():\n    torch.manual_seed(0)\n    return CommOverlap('objects', record=False), (torch.randn(6, 16),)\n"
                   "def make_annotated():\n    return CommOverlap('annotate'), (torch.randn(6, 16),)\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["explain", f"{src}:make", "--no-grad", "--out", str(tmp_path / "e"), "--quiet"]) == 0
        assert main(["assign", f"{src}:make_annotated", "--no-grad", "--out", str(tmp_path / "a"), "--quiet"]) == 0
    files = {p.name for p in (tmp_path / "e").iterdir()}
    assert not any(f.startswith("backward") for f in files)
    assert {"forward_before.py", "forward_upstream.py", "forward_default.py", "sanitizer_default.txt", "summary.txt",
            "timeline.png", "memory.png", "trace.json"} <= files
    summary = (tmp_path / "e" / "summary.txt").read_text()
    assert "forward only" in summary and "do not apply" in summary and "tensor addmm" in summary
    assert "use of freed memory: tensor addmm" in (tmp_path / "e" / "sanitizer_upstream.txt").read_text()
    assert "0 error(s)" in (tmp_path / "e" / "sanitizer_default.txt").read_text()
    assert "streamnb" in (tmp_path / "a" / "table.txt").read_text()   # the forward's four assignments


# --- issue 46, item 2: the current stream of a compiled inference graph, each way it is found ---------------------

def _compiled(fn, upstream=False, objects_style=True):
    graphs = {}
    torch._dynamo.reset()
    with (cpu_streams() if objects_style else contextlib.nullcontext()), torch.no_grad(), \
            use_streamnb_passes(upstream, cpu_as="meta") as sw:
        torch.compile(fn, backend=executor_backend(graphs), fullgraph=True)(*XS())
    return sw, graphs


def test_current_stream_traced_unpinned_seed_mode():
    # upstream=True pins nothing: the registry knows dynamo's traced ambient stream, never the side stream
    sw, graphs = _compiled(objects(record=False), upstream=True)
    (reg,) = sw.registries
    assert reg.pinned_current is None and reg.current_streams
    side = {get_stream(n) for n in graphs["forward"][0].graph.nodes if n.name == "mm"}
    assert not side & set(reg.current_streams)
    assert verdicts(sw.explain(graphs).reports["forward 0"]) == ["unsafe_reuse"]


def test_current_stream_from_dynamos_table_without_a_registry():
    # explain_compiled(graphs) with no registry: dynamo's ambient stream, found in its table
    sw, graphs = _compiled(objects(join=False), upstream=True)
    mine = explain_compiled(graphs).reports["forward 0"]
    assert verdicts(mine) == verdicts(sw.explain(graphs).reports["forward 0"]) and "race" in verdicts(mine)


def test_current_stream_fresh_index_for_annotate_inference():
    # no ambient stream (plain torch.compile, no cpu_streams), the seed's mode: the region is dynamo's stream 0 and the
    # judge's current stream is a fresh index, so the 5 errors of the unsynced region are found (its read of an input,
    # made on the caller's stream, with them)
    sw, graphs = _compiled(inference_fn, upstream=True, objects_style=False)
    assert verdicts(explain_compiled(graphs).reports["forward 0"]) == verdicts(sw.explain(graphs).reports["forward 0"])
    assert len(sw.explain(graphs).reports["forward 0"].errors) == 5


# --- the four programs, both styles ------------------------------------------------------------------------------

@pytest.mark.parametrize("name,style", [(n, s) for n in PROGRAMS for s in STYLES])
def test_inference_program_explained_and_compiled(name, style):
    model, xs = build_inference(name, style)
    ex = explain(model, *xs)
    assert ex.capture.inference
    assert ex.modes["default"].forward_report.errors == [] and ex.modes["default"].matches_eager
    assert ex.modes["upstream"].matches_eager
    for upstream, mode in ((False, "default"), (True, "upstream")):
        got = compile_inference(name, style, upstream=upstream)
        torch.testing.assert_close(got["outputs"], got["eager"])
        assert verdicts(got["explanation"].reports["forward 0"]) == verdicts(ex.modes[mode].forward_report)
    seed = ex.modes["upstream"].forward_report.errors
    assert bool(seed) is (style == "annotate")   # the seed's missing forward syncs, named; the objects programs sync


def test_the_programs_own_missing_record_stream_is_named():
    torch.manual_seed(0)
    with cpu_streams(): m = CommOverlap("objects", record=False).requires_grad_(False)
    ex = explain(m, torch.randn(6, 16))
    (err,) = ex.written.errors
    assert err.kind == "unsafe_reuse" and "tensor addmm" in err.message and "record_stream" in err.message
    assert ex.modes["default"].forward_report.errors == []


def test_build_inference_refuses_unknown_names():
    with pytest.raises(KeyError, match="no inference program 'x'"): build_inference("x", "objects")
    with pytest.raises(ValueError, match="style must be one of"): build_inference("kv_side", "cuda")


def test_the_default_protects_h_even_where_the_program_records_it():
    # chapter 20b's prose: the default's dealloc pass does not credit a user's record_stream (a known cost, not a race):
    # the fixed TP layer's default forward still holds h (addmm) with a sync_dealloc, and loses the overlap
    torch.manual_seed(0)
    with cpu_streams(): m = CommOverlap("objects").requires_grad_(False)
    ex = explain(m, torch.randn(6, 16))
    de = ex.modes["default"]
    assert ops(de.forward)["sync_dealloc"] == 2 and de.forward_report.errors == []   # h's and mul's
    assert de.timeline.makespan > ex.modes["upstream"].timeline.makespan == ex.before.makespan
