"""The forward, judged and synced (issue 27, item 4): the default protects the forward's frees (correction 22, in
test_dealloc.py); `sync_forward` / `forward_syncs=True` insert the forward's syncs (beyond PyTorch) and the sanitizer
then proves every real pattern's forward race-free, with eager's numbers."""
from __future__ import annotations

import pytest
import torch

from streamnb.cli import main
from streamnb.explainer import explain
from streamnb.graph import GraphBuilder, StreamnbError, StreamRegistry, aten, streams, use_registry
from streamnb.patterns import PATTERNS, explain_pattern
from streamnb.pipeline import run_stream_passes, sync_forward
from streamnb.sanitizer import sanitize
from streamnb.streamops import decode

pytestmark = pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.:FutureWarning")


def fork_without_syncs():
    "A forward: `mul` (stream 0) read by `sin` (stream 1) and `cos` (stream 2); `add` on stream 0 reads both."
    b = GraphBuilder(); x = b.input("primals_1", tag=None)
    a = b.op(aten.mul.Tensor, x, x, stream=0, tag="is_forward")
    s = b.op(aten.sin.default, a, stream=1, tag="is_forward")
    c = b.op(aten.cos.default, a, stream=2, tag="is_forward")
    return b.output(b.op(aten.add.Tensor, s, c, stream=0, tag="is_forward"))


def test_sync_forward_orders_every_cross_stream_edge_of_the_forward():
    g = fork_without_syncs()
    with use_registry(StreamRegistry(start=100, current_stream=0)) as reg:
        assert set(sanitize(g, registry=reg).kinds) == {"race", "unsafe_reuse"}
        run_stream_passes(g, forward_syncs=True)
        assert sanitize(g, registry=reg, reorder=True).ok


def test_sync_forward_leaves_the_backward_alone_and_tags_the_forward():
    "Only forward consumers get waits; the backward's syncs are the passes' job, as before."
    b = GraphBuilder(); x, t = b.input("primals_1", tag=None), b.input("tangents_1")
    a = b.op(aten.mul.Tensor, x, x, stream=1, tag="is_forward")
    y = b.op(aten.add.Tensor, a, 1.0, stream=0, tag="is_forward")
    g_ = b.op(aten.mul.Tensor, t, a, stream=2)   # backward, reads a made on stream 1
    g = b.output(y, g_)
    with use_registry(StreamRegistry(start=100, current_stream=0)): sync_forward(g)
    waits = g.graph.find_nodes(op="call_function", target=streams.wait_event.default)
    assert [w.next.name for w in waits] == ["add"]
    assert {n.meta["partitioner_tag"] for n in g.graph.nodes if n.target in (streams.record_event.default,
            streams.wait_event.default)} == {"must_be_in_forward"}
    assert g.graph.find_nodes(op="placeholder")[1].meta["partitioner_tag"] == "is_backward"   # restored


def test_forward_syncs_refused_with_the_seed_and_all_or_nothing():
    with pytest.raises(StreamnbError, match="forward_syncs"):
        run_stream_passes(fork_without_syncs(), upstream=True, forward_syncs=True)


@pytest.mark.parametrize("style", ["annotate", "objects"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_pattern_forward_is_race_free_with_forward_syncs(name, style):
    """The annotate style has no forward sync at all (7 patterns, most with forward races); with forward_syncs=True
    the default's forward is race-free and still computes what eager PyTorch does, and the backward stays clean. The
    objects style too (its `record_stream`s once failed here: MissingValError, before correction 23)."""
    ex = explain_pattern(name, style, forward_syncs=True)
    r = ex.modes["default"]
    assert r.forward_report.ok and r.report.ok, (r.forward_report, r.report)
    assert r.error is None and r.matches_eager
    note = ex.forward_note()   # the processed forward is clean; what the program as written lacks is still named
    if ex.written.errors: assert "`forward_syncs=True` inserted syncs" in note and "fix the program" in note, note
    else: assert note is None, note
    assert bool(ex.written.errors) == (style == "annotate" and name != "async_grad_reduce")


def test_the_note_offers_forward_syncs_when_the_forward_races():
    ex = explain_pattern("parallel_block", "annotate")
    assert ex.modes["default"].forward_report.errors
    assert "forward_syncs=True" in ex.forward_note() and "--forward-syncs" in ex.forward_note()


def test_cli_forward_syncs(tmp_path, capsys):
    src = tmp_path / "pb.py"
    src.write_text("from streamnb.patterns import build\ndef factory(): return build('parallel_block', 'annotate')\n")
    assert main(["explain", f"{src}:factory", "--out", str(tmp_path / "a"), "--quiet"]) == 0
    without = capsys.readouterr().out
    assert main(["explain", f"{src}:factory", "--out", str(tmp_path / "b"), "--quiet", "--forward-syncs"]) == 0
    with_ = capsys.readouterr().out
    fw = lambda text: [line.split()[-3] for line in text.splitlines() if line.startswith("default")]
    assert fw(without) != ["0"] and fw(with_) == ["0"]


def test_a_forward_output_made_on_a_side_stream_is_joined_before_the_backward():
    """A prefetcher returns the next batch, made on a side stream, from a joint graph whose backward follows. The
    forward's join (correction 17, run by sync_forward) goes where the forward ends, before the backward's first node:
    placed before the joint graph's output it once threaded a backward value through a forward sync, and the
    partitioner refused the graph ("Node getitem_3 was invalid, but is output")."""
    def prefetch(x, nxt):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side): nb = nxt * 1.5    # the next batch; no grad
        return (x * 2).sum(), nb
    xs = (torch.randn(8, 8, requires_grad=True), torch.randn(8, 8))
    ex = explain(prefetch, *xs, forward_syncs=True)
    r = ex.modes["default"]
    assert r.error is None and r.matches_eager, r.error
    assert r.forward_report.ok and sanitize(r.forward, reorder=True).ok
    joint = ex.capture.process(forward_syncs=True).joint
    wait = next(n for n in joint.graph.nodes if (op := decode(n, joint)) is not None and op.kind == "wait_event")
    backward = [n for n in joint.graph.nodes if n.meta.get("partitioner_tag") == "is_backward" and n.op == "call_function"]
    assert wait.meta["partitioner_tag"] == "must_be_in_forward" and backward
    assert all(wait._sort_key < n._sort_key for n in backward)
