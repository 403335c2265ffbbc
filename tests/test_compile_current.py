"""`switch.explain(graphs)` and `explain_compiled` never take a stream dynamo registered for the program as the current
stream (issue 46): the current stream is the one the passes pinned (training, default mode), dynamo's ambient stream
(an accelerator, or `cpu_streams`), or else a fresh index no graph names. Without that, an inference graph's `annotate`
region, which dynamo numbers 0 when it registered no ambient stream, merged into the current stream: 0 errors for 4."""
import warnings

import torch
import torch.fx.traceback as fxt

from streamnb.capturing import cpu_streams
from streamnb.compiling import executor_backend, explain_compiled, use_streamnb_passes
from streamnb.graph import get_stream

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def annotated(x, w):
    y = x.sin()
    with fxt.annotate({"stream": 1}):   # a compiler-owned stream: nothing orders it after y, nor add after it
        h = (y @ w).relu()
    return h + y


def compiled(fn, *xs, grad=False, **switch):
    torch._dynamo.reset()
    graphs: dict = {}
    with use_streamnb_passes(cpu_as="meta", **switch) as sw:
        out = torch.compile(fn, backend=executor_backend(graphs))(*xs)
    if grad: out.sum().backward()
    return sw, graphs


EXPECTED = [("race", ("mm", "sin")), ("race", ("add", "relu")), ("unsafe_reuse", ("mm", "add")), ("unsafe_reuse", ("add", "add"))]


def test_inference_no_current_stream_is_never_a_program_stream():
    with torch.no_grad():
        sw, graphs = compiled(annotated, torch.randn(8, 8), torch.randn(8, 8))
    (reg,), (renum,) = sw.registries, sw.renumbered
    assert reg.pinned_current is None and not reg.current_streams and renum == {1: 0}   # the way that was blind
    fw = graphs["forward"][0]
    assert {get_stream(n) for n in fw.graph.nodes if n.name in ("mm", "relu")} == {0}
    for ex in (sw.explain(graphs), explain_compiled(graphs)):
        assert [(e.kind, e.nodes) for e in ex.reports["forward 0"].errors] == EXPECTED


def test_training_the_pinned_current_stream():
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    sw, graphs = compiled(annotated, x, w, grad=True)
    (reg,), (renum,) = sw.registries, sw.renumbered
    assert reg.pinned_current is not None and reg.pinned_current not in renum.values()
    races = [(e.kind, e.nodes) for e in sw.explain(graphs).reports["forward 0"].errors if e.kind == "race"]
    assert ("race", ("mm", "sin")) in races   # the annotate region's forward: no sync (issue 46, item 1, open)


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
