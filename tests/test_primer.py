"""The primer's pictures show what its prose claims: checked on the simulated Timelines and on the drawn artists."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from streamnb.graph import streams
from streamnb.plot import HOST_ROW, plot_timeline, rows
from streamnb.primer import ABC_COST, ABC_SYNCS, REUSE_COST, US, abc_graph, reuse_graph
from streamnb.sanitizer import sanitize
from streamnb.simulator import simulate


def abc(*a, **kw): return simulate(abc_graph(*a, **kw), cost=ABC_COST)
def reuse(*a, **kw): return simulate(reuse_graph(*a, **kw), cost=REUSE_COST)
def us(t): return round(t / US, 9)


def gids(*timelines):
    fig = plot_timeline(*timelines)
    out = {a.get_gid() for ax in fig.axes for a in ax.get_children() if a.get_gid()}
    plt.close(fig)
    return out


def test_one_stream_is_a_queue():
    tl = abc(0)
    assert tl.streams == [0]
    assert [tuple(map(us, tl.spans[k][1:])) for k in "abc"] == [(0, 5), (5, 7), (7, 8)]   # back to back
    assert us(tl.makespan) == 8


def test_side_stream_without_sync_races():
    tl = abc(1)
    assert tl.spans["b"][1] < tl.spans["a"][2]                                   # a and b overlap
    assert [(r.consumer, r.producer, r.overlaps) for r in tl.unordered_reads] == [("c", "a", True)]
    assert "kernel:c" in gids(tl) and sanitize(abc_graph(1)).kinds == ["race", "unjoined_output"]   # a is returned too


def test_wait_event_holds_the_stream_not_the_host():
    tl = abc(1, "wait_event")
    (w,) = tl.waits
    assert (w.stream, us(w.start), us(w.end)) == (0, 2, 5)
    assert tl.spans["c"][1] == tl.spans["a"][2] and us(tl.spans["b"][1]) == 0
    (f,) = tl.flows
    assert (f.src_stream, us(f.src_time), f.dst_stream) == (1, 5, 0)
    assert tl.host_time == 0 and HOST_ROW not in rows(tl) and not tl.unordered_reads
    g = gids(tl)
    assert {"wait:wait_event_default", "flow:7"} <= g and not any(x.startswith("unsafe_free") for x in g)


def test_early_wait_holds_b_back():
    assert (us(abc(1, "wait_event").makespan), us(abc(1, "wait_event", early=True).makespan)) == (6, 8)


@pytest.mark.parametrize("sync", [s for s in ABC_SYNCS if s != "wait_event"])
def test_host_syncs_block_the_host(sync):
    for early, makespan in ((False, 6), (True, 8)):
        tl = abc(1, sync, early=early)
        host = [w for w in tl.waits if w.stream is None]
        assert [(us(w.start), us(w.end)) for w in host] == [(0, 5)]
        assert rows(tl)[0] == HOST_ROW and us(tl.makespan) == makespan and not tl.unordered_reads
    assert us(abc(1, sync, early=True).spans["b"][1]) == 5


def test_stream_order_protects_a_same_stream_free():
    tl = reuse(b_stream=0)
    assert tl.unsafe_frees == [] and sanitize(reuse_graph(b_stream=0)).ok


def test_free_across_streams_is_unsafe():
    tl = reuse()
    (u,) = tl.unsafe_frees
    assert (u.tensor, u.stream, u.reader, u.reader_stream) == ("a", 0, "b", 1)
    assert (us(u.freed_at), us(u.read_end)) == (1, 6)
    assert u.freed_at <= tl.lifetimes["c"].alloc < u.read_end                    # stream 0 allocates meanwhile
    assert "unsafe_free:a" in gids(tl)
    assert sanitize(reuse_graph()).kinds == ["unsafe_reuse", "unjoined_output"]   # b, on stream 1, is returned


@pytest.mark.parametrize("protect", ["record_stream", "sync_dealloc"])
def test_protection_defers_the_free_without_delay(protect):
    free, tl = reuse(), reuse(protect=protect)
    assert tl.unsafe_frees == [] and "unsafe_reuse" not in sanitize(reuse_graph(protect=protect)).kinds
    assert tl.lifetimes["a"].free == tl.spans["b"][2]                            # back in the pool when b is done
    assert tl.spans["c"][1:] == free.spans["c"][1:]                              # c is not delayed
    assert tl.peak_memory > free.peak_memory                                     # a's bytes held longer
    (op,) = [s for s in tl.syncs if s.op == protect]
    expect_stream = 1 if protect == "record_stream" else 0
    assert (op.stream, op.end) == (expect_stream, tl.spans["b"][2])
    g = gids(tl)
    assert not any(x.startswith("unsafe_free") for x in g)
    if protect == "record_stream": assert {"record_stream:record_stream_default", "deferred_free:a"} <= g
    else: assert "sync_dealloc:sync_dealloc_default" in g


def test_primer_exercise_grades():
    "The chapter's exercise, as exported (`wait_exercise`): its worked solution passes, the notebook's attempts fail."
    from streamnb.exercises import insert, remove
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    best = ex.check(ex.best())
    assert best.ok and (best.syncs, best.makespan_us) == (2, 6.0), best
    wrong = ex.start(); remove(wrong, "synchronize_stream_default")
    g = ex.check(wrong)
    assert not g.ok and any(p.startswith("race on a") for p in g.problems)
    slow = ex.start(); remove(slow, "synchronize_stream_default")
    insert(slow, streams.record_event.default, 7, 1, after="a"); insert(slow, streams.wait_event.default, 7, 0, before="b")
    g = ex.check(slow)
    assert not g.ok and any(p.startswith("makespan 8") for p in g.problems)
    unchanged = ex.check(ex.start())   # the start graph: a host sync before b, which blocks the host and delays b
    assert not unchanged.ok and unchanged.makespan_us == 8
    assert unchanged.problems[0].startswith("node synchronize_stream_default: synchronize_stream blocks the host")
    assert unchanged.problems[1].startswith("makespan 8 µs; the best is 6 µs")


def test_bridge_table_names_real_ops():
    """The primer's table from eager calls to graph ops: every graph op it names is a `torch.ops.streams` op, and the
    ops it says block the host are exactly the ones `streamops` decodes as host syncs."""
    import re
    import nbformat
    import torch
    from pathlib import Path
    from streamnb.streamops import OPS
    nb = nbformat.read(Path(__file__).resolve().parent.parent / "nbs" / "00_primer.ipynb", as_version=4)
    md = next(c.source for c in nb.cells if c.cell_type == "markdown" and "| eager PyTorch | in the graph | blocks |" in c.source)
    rows = [[x.strip() for x in r.strip().strip("|").split("|")] for r in md.splitlines()
            if r.startswith("| `") and r.count("|") >= 4]
    named = {}
    for eager, graph, blocks in rows:
        for op in re.findall(r"`(\w+)\(", graph):
            named[op] = blocks
    assert {"record_event", "wait_event", "wait_stream", "record_stream", "synchronize_event", "synchronize_stream",
            "synchronize_device"} <= set(named), named
    for op, blocks in named.items():
        assert hasattr(torch.ops.streams, op), op
        spec = OPS[getattr(torch.ops.streams, op).default]
        assert spec.kind == op and blocks.startswith("**the host**") == spec.host, (op, blocks)


def test_bad_arguments():
    with pytest.raises(ValueError, match="must be one of"): abc_graph(1, "wait")
    with pytest.raises(ValueError, match="must be one of"): reuse_graph(protect="free")
