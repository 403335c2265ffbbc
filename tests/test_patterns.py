"""Real multi-stream patterns (issue 27 item 8), both styles, through explain: streamnb's default equals eager with no
race in the backward; the forward is race-free where the program syncs it and names the missing syncs where it does not;
the seed's problems are named."""
import warnings

import pytest
import torch

from streamnb.capturing import cpu_streams, eager
from streamnb.explainer import explain
from streamnb.patterns import PATTERNS, STYLES, MoESharedExpert, build, compile_pattern, explain_pattern

warnings.filterwarnings("ignore", category=UserWarning)
CASES = [(n, s) for n in PATTERNS for s in STYLES]
NO_BACKWARD_STREAM = ("batch_prefetch", "activation_copy")   # the prefetchers' side streams do forward work only


@pytest.mark.parametrize("name,style", CASES)
def test_pattern_explained(name, style):
    ex = explain_pattern(name, style)
    de, up = ex.modes["default"], ex.modes["upstream"]
    assert ex.capture.frontend == ("aot" if style == "annotate" else "dynamo")
    assert ex.capture.streams, "the pattern's streams were not seen"
    assert (de.error, de.matches_eager) == (None, True)
    assert not de.report.errors and not de.reorder_report.errors, str(de.report)
    fw = de.forward_report.errors
    if style == "objects":   # synced by the program: as written too (forward and custom backwards), as eager runs it
        assert not fw, str(de.forward_report)
        assert not ex.written.errors and not ex.backward_unjudged, (ex.written, ex.backward_unjudged)
        assert (ex.written_backward is None) == (name != "async_grad_reduce") and not getattr(ex.written_backward, "errors", 0)
    elif name != "async_grad_reduce":
        assert fw and all(e.kind in ("race", "unsafe_reuse", "unjoined_output") for e in fw)
        assert "the forward's syncs are the program's job" in ex.summary_text()
    seed_fails = up.error is not None or bool(up.reorder_report.errors) or bool(up.report.errors)
    # annotate-style batch_prefetch: the backward reads on the current stream what the forward made on stream 1, which
    # nothing joined (correction 29); the objects style joins it in the forward
    assert seed_fails == (name not in NO_BACKWARD_STREAM or (name, style) == ("batch_prefetch", "annotate"))


def test_objects_and_annotate_compute_the_same():
    for name in PATTERNS:
        a, o = (build(name, s) for s in STYLES)
        torch.manual_seed(1)
        xs = tuple(torch.randn_like(x).requires_grad_(x.requires_grad) for x in a[1])
        with cpu_streams(eager=True):
            torch.testing.assert_close(a[0](*xs), o[0](*xs))


def test_missing_record_stream_is_named():
    """A shared expert joined with wait_stream but without record_stream: the seed's forward reuses the block unsafely,
    and the sanitizer names the missing record_stream; the default protects the free (correction 22) and is clean."""
    class NoRecord(MoESharedExpert):
        def join(self, i, *made_there): super().join(i)
    torch.manual_seed(0)
    with cpu_streams(): m = NoRecord("objects")
    ex = explain(m, torch.randn(6, 16, requires_grad=True))
    errs = ex.modes["upstream"].forward_report.errors
    assert [e.kind for e in errs] == ["unsafe_reuse"]
    assert "record_stream" in errs[0].message and "allocated on stream 1" in errs[0].message
    default = ex.modes["default"]
    assert default.forward_report.ok and default.matches_eager
    assert default.forward.graph.find_nodes(op="call_function", target=torch.ops.streams.sync_dealloc.default)


def test_build_refuses_unknown_names():
    with pytest.raises(KeyError, match="no pattern 'x'"): build("x", "objects")
    with pytest.raises(ValueError, match="style must be one of"): build("dual_norm", "cuda")


@pytest.mark.parametrize("name,style", CASES)
def test_pattern_under_torch_compile(name, style):
    """The same patterns compiled with torch.compile under use_streamnb_passes (streamnb's default, `compile_pattern`):
    outputs and gradients equal eager PyTorch's; the compiled backward and forward have no sanitizer error: the program
    syncs the forward (objects style), or the switch does, its streams being the compiler's (annotate, correction 24)."""
    got = compile_pattern(name, style)
    want = eager(got["model"], *got["inputs"])
    torch.testing.assert_close(got["outputs"], want.outputs if isinstance(want.outputs, tuple) else (want.outputs,))
    assert set(got["grads"]) == set(want.param_grads)
    for n, g in got["grads"].items(): torch.testing.assert_close(g, want.param_grads[n])
    assert len(got["graphs"]["forward"]) == len(got["graphs"]["backward"]) == 1
    assert not got["reports"]["backward"].errors
    fw_errors = got["reports"]["forward"].errors
    assert not fw_errors, fw_errors   # objects: the program syncs it; annotate: the switch does (correction 24)
