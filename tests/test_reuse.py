"""`unsafe_reuse` is judged when the allocating stream may hand the block out again, at its next kernel after the free
(or the graph's end), not at the free: a wait that stream makes before its next kernel orders the reuse (correct
fork/join code gets no false alarm), and the same program without that wait is still flagged."""
import warnings

import pytest
import torch

import streamnb

from streamnb.capturing import capture, cpu_streams
from streamnb.graph import GraphBuilder, StreamRegistry, aten, streams
from streamnb.sanitizer import sanitize

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def reuses(gm):
    return [(e.nodes, e.streams) for e in sanitize(gm, registry=StreamRegistry(current_stream=0)).errors
            if e.kind == "unsafe_reuse"]


def fork_join(second_wait: bool, later_kernel: bool = True):
    "`d` made on stream 1, last read by `y` on stream 0; then stream 1 (after a wait on 0, or not) makes `e`."
    b = GraphBuilder(); x = b.input("x")
    b.sync(streams.wait_stream.default, 1, 0)
    d = b.op(aten.mul.Tensor, x, 2.0, stream=1, name="d")
    b.sync(streams.wait_stream.default, 0, 1)
    y = b.op(aten.add.Tensor, d, 1.0, stream=0, name="y")        # d's last use: its block goes back to stream 1's pool
    if second_wait: b.sync(streams.wait_stream.default, 1, 0)   # stream 1's next kernel is ordered after y
    outs = [y]
    if later_kernel:
        e = b.op(aten.mul.Tensor, x, 3.0, stream=1, name="e")
        b.sync(streams.wait_stream.default, 0, 1)
        outs.append(e)
    return b.output(*outs)


def test_a_wait_before_the_next_kernel_orders_the_reuse():
    assert reuses(fork_join(second_wait=True)) == []
    assert reuses(fork_join(second_wait=False)) == [(("y", "y"), (0, 1))]
    msg = [e for e in sanitize(fork_join(False), registry=StreamRegistry(current_stream=0)).errors][0].message
    assert "stream 1's next kernel, e, may be handed it" in msg


def test_with_no_later_kernel_the_graphs_end_decides():
    # nothing more runs on stream 1 in the graph: the caller's later work there may reuse the block
    assert reuses(fork_join(second_wait=False, later_kernel=False)) == [(("y", "y"), (0, 1))]
    assert reuses(fork_join(second_wait=True, later_kernel=False)) == []


@pytest.mark.parametrize("second_wait", [True, False])
def test_the_issues_program_as_written(second_wait):
    with cpu_streams():
        side = torch.cuda.Stream()
        def prog(x):
            cur = torch.cuda.current_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                d = x * 2
            cur.wait_stream(side)
            y = d + 1                       # d's last use: freed to side's pool here
            if second_wait: side.wait_stream(cur)
            with torch.cuda.stream(side):
                e = x * 3
            cur.wait_stream(side)
            return y, e                     # (returned: e itself is never freed in the graph)
        cap = capture(prog, torch.randn(8, 8, requires_grad=True))
    found = [e for e in sanitize(cap.forward, inputs_ready="made").errors if e.kind == "unsafe_reuse"]
    assert (found == []) is second_wait, found


# -- the issue's program as a user writes it, through `streamnb.explain` ------------------------------------------
# d is allocated on side and last read on the current stream (y): with no record_stream its block goes back to side's
# pool when y is issued (the last reference goes on the host), and the caching allocator hands a freed block only to a
# later allocation on the stream it was allocated on: side's next kernel (e). What orders y before e is a join that
# side makes before it issues e, in any form; the same join after e is too late.

class ForkJoin(torch.nn.Module):
    "The issue's fork/join program; `join` is how side waits for the current stream before its next kernel."
    def __init__(self, side, join):
        super().__init__()
        self.side, self.join = side, join

    def forward(self, x):
        side, cur = self.side, torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            d = x * 2
        cur.wait_stream(side)
        y = d + 1                      # d's last use: freed to side's pool here
        if self.join == "wait_stream": side.wait_stream(cur)
        elif self.join == "event":
            ev = torch.cuda.Event(); ev.record(cur); side.wait_event(ev)
        with torch.cuda.stream(side):
            e = x * 3                  # side's next kernel: the first that may be handed d's block
        if self.join == "too late": side.wait_stream(cur)
        cur.wait_stream(side)
        return y * e


def explained(join):
    with cpu_streams():
        ex = streamnb.explain(ForkJoin(torch.cuda.Stream(), join), torch.randn(8, 8, requires_grad=True))
    return ex


@pytest.mark.parametrize("join, flagged", [("wait_stream", False), ("event", False), (None, True), ("too late", True)])
def test_the_issues_program_through_explain(join, flagged):
    ex = explained(join)
    found = [e for e in ex.written.errors if e.kind == "unsafe_reuse"]
    if not flagged: assert ex.written.ok, ex.written
    else:
        assert [(e.tensor, e.nodes[0]) for e in found] == [("mul", "add")], ex.written   # d (mul), last read by y (add)
        assert "stream 1's next kernel, mul_1, may be handed it" in found[0].message
    assert all(r.matches_eager and r.forward_report.ok for r in ex.modes.values())   # the passes leave the forward as written
