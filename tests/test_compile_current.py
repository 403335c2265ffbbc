"""`switch.explain(graphs)` and `explain_compiled` never take a stream dynamo registered for the program as the current
stream (issue 46): the current stream is the one the passes pinned (training, default mode), dynamo's ambient stream
(an accelerator, or `cpu_streams`), or else a fresh index no graph names. Without that, an inference graph's `annotate`
region, which dynamo numbers 0 when it registered no ambient stream, merged into the current stream: 0 errors for 4."""
import warnings

import pytest

import torch

from streamnb.examples import inference_fn
from streamnb.cpustreams import cpu_streams
from streamnb.compiling import executor_backend, explain_compiled, use_streamnb_passes
from streamnb.graph import get_stream

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def compiled(fn, *xs, grad=False, **switch):
    torch._dynamo.reset()
    graphs: dict = {}
    with use_streamnb_passes(cpu_as="meta", **switch) as sw:
        out = torch.compile(fn, backend=executor_backend(graphs))(*xs)
    if grad: out.sum().backward()
    return sw, graphs


EXPECTED = [("race", ("mm", "sin")), ("race", ("mm", "arg1_1")),   # (its read of an input, made on the caller's stream)
            ("race", ("add", "relu")), ("unsafe_reuse", ("mm", "add")), ("unsafe_reuse", ("add", "add"))]


def unsynced(monkeypatch):
    "The switch without corrections 24 and 25, so that the judge has the annotate region's races to find."
    monkeypatch.setattr(use_streamnb_passes, "_sync_owned_forward", lambda self, gm, k: None)
    monkeypatch.setattr(use_streamnb_passes, "_protect_inference_frees", lambda self, gm: None)


def test_inference_no_current_stream_is_never_a_program_stream(monkeypatch):
    unsynced(monkeypatch)
    with torch.no_grad():
        sw, graphs = compiled(inference_fn, torch.randn(8, 8), torch.randn(8, 8))
    (reg,), (renum,) = sw.registries, sw.renumbered
    assert reg.pinned_current is None and not reg.current_streams and renum == {1: 0}   # the way that was blind
    fw = graphs["forward"][0]
    assert {get_stream(n) for n in fw.graph.nodes if n.name in ("mm", "relu")} == {0}
    for ex in (sw.explain(graphs), explain_compiled(graphs)):
        assert [(e.kind, e.nodes) for e in ex.reports["forward 0"].errors] == EXPECTED


def test_training_the_pinned_current_stream(monkeypatch):
    unsynced(monkeypatch)
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    sw, graphs = compiled(inference_fn, x, w, grad=True)
    (reg,), (renum,) = sw.registries, sw.renumbered
    assert reg.pinned_current is not None and reg.pinned_current not in renum.values()
    races = [(e.kind, e.nodes) for e in sw.explain(graphs).reports["forward 0"].errors if e.kind == "race"]
    assert ("race", ("mm", "sin")) in races


@pytest.mark.parametrize("grad", [True, False])
def test_correction_24_annotate_regions_get_the_forwards_syncs(grad):
    # issue 46, item 1: compiled, an annotate region runs on a side stream; eager runs it on one stream and is safe
    xs = (torch.randn(8, 8, requires_grad=grad), torch.randn(8, 8, requires_grad=grad))
    for upstream in (False, True):
        with torch.set_grad_enabled(grad):
            sw, graphs = compiled(inference_fn, *xs, grad=grad, upstream=upstream)
        fw = sw.explain(graphs).reports["forward 0"].errors
        assert (fw == []) is (not upstream), fw
        if upstream: assert ("race", ("mm", "sin")) in [(e.kind, e.nodes) for e in fw]
    torch._dynamo.reset()
    with torch.set_grad_enabled(grad), use_streamnb_passes(cpu_as="meta"):   # the default equals eager
        out = torch.compile(inference_fn, backend=executor_backend({}))(*xs)
    torch.testing.assert_close(out, inference_fn(*xs))


def test_correction_25_an_inference_graphs_frees_are_protected(monkeypatch):
    # issue 46, item 3: h is made on a side stream and last read on the current one; AOTAutograd runs no dealloc pass
    # on an inference graph, so its block went back to the side stream's pool with nothing protecting it
    def prog(x, w):
        cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            h = (x @ w).relu()
        cur.wait_stream(side)
        return h.sum() + x.sum()
    def kinds():
        with cpu_streams(), torch.no_grad():
            sw, graphs = compiled(prog, torch.randn(8, 8), torch.randn(8, 8))
        return [e.kind for e in sw.explain(graphs).reports["forward 0"].errors], sw.graphs[0].meta["streamnb_passes"]
    errs, ran = kinds()
    assert errs == [] and "sync_deallocations" in ran
    monkeypatch.setattr(use_streamnb_passes, "_protect_inference_frees", lambda self, gm: None)
    assert kinds()[0] == ["unsafe_reuse"]


def test_inference_with_stream_objects_uses_dynamos_ambient_stream():
    def prog(fixed):
        def f(x, w):
            cur, side = torch.cuda.current_stream(), torch.cuda.Stream()
            y = x.sin()
            if fixed: side.wait_stream(cur)
            with torch.cuda.stream(side):
                h = (y @ w).relu()
            cur.wait_stream(side)
            if fixed: h.record_stream(cur)   # h, made on side, is freed after its read on cur
            return h + y
        return f
    for fixed in (False, True):
        with cpu_streams(), torch.no_grad():
            sw, graphs = compiled(prog(fixed), torch.randn(8, 8), torch.randn(8, 8))
        (reg,) = sw.registries
        assert reg.current_streams and reg.pinned_current is not None   # dynamo's ambient stream, traced
        errs = [(e.kind, e.nodes) for e in sw.explain(graphs).reports["forward 0"].errors]
        assert (errs == []) is fixed and (fixed or ("race", ("mm", "sin")) in errs), errs
