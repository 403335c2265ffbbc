"""streamnb.exercises: the solution passes, and each kind of wrong answer is caught with the problem named."""
import ast
from pathlib import Path

import pytest
import torch

import streamnb.exercises as exmod
from streamnb.exercises import Exercise, Grade, check, count_syncs, insert, move, remove
from streamnb.graph import GraphBuilder, StreamnbError, streams

aten = torch.ops.aten
REC, WAIT, DEALLOC = streams.record_event.default, streams.wait_event.default, streams.sync_dealloc.default


def two_streams():
    "mul (stream 1) feeds add (stream 0); neg (stream 0) needs nothing from stream 1; outputs are never freed."
    b = GraphBuilder()
    x = b.input("x")
    mul = b.op(aten.mul.Tensor, x, x, stream=1, name="mul")
    neg = b.op(aten.neg.default, x, stream=0, name="neg")
    add = b.op(aten.add.Tensor, mul, neg, stream=0, name="add")
    return b.output(add, mul)


def solve(gm):
    insert(gm, REC, 1, 1, after="mul")
    insert(gm, WAIT, 1, 0, before="add")
    return gm


COST = {"mul": 0.003, "neg": 0.002, "add": 0.001}
EX = Exercise("order add after mul", "fewest syncs, no slower", two_streams, solve, cost=COST)


def side_read():
    "t (stream 0) is read by r on stream 1; t is freed after r; u on stream 0 allocates afterwards."
    b = GraphBuilder(shape=(64, 64))
    x = b.input("x")
    t = b.op(aten.mul.Tensor, x, x, stream=0, name="t")
    b.sync(REC, 1, 0); b.sync(WAIT, 1, 1)
    r = b.op(aten.neg.default, t, stream=1, name="r")
    u = b.op(aten.sin.default, x, stream=0, name="u")
    return b.output(r, u)


def dealloc_solution(gm):
    insert(gm, REC, 2, 1, after="r")
    insert(gm, DEALLOC, 2, 0, exmod.node(gm, "t"), after="u")   # free t only once r is done, after u
    return gm


DEALLOC_EX = Exercise("free t safely", "t is read on stream 1: free it without a race and without a stall",
                      side_read, dealloc_solution, cost={"t": 0.001, "r": 0.004, "u": 0.002})


def test_solutions_pass():
    for ex in (EX, DEALLOC_EX):
        g = ex.check(ex.best())
        assert isinstance(g, Grade) and g.ok, str(g)
        assert g.problems == [] and g.syncs == g.best_syncs
        assert g.makespan_us == pytest.approx(g.best_makespan_us)
        assert str(g).splitlines()[0] == f"{ex.title}: correct"
    assert EX.check(EX.best()).makespan_us == pytest.approx(4.0)


def test_missing_wait_is_a_race():
    a = EX.start()
    insert(a, REC, 1, 1, after="mul")          # the record alone orders nothing
    g = check(EX, a)
    assert not g.ok
    assert g.report is not None and [e.kind for e in g.report.errors] == ["race"]
    assert any(p.startswith("race on mul: add (stream 0) and mul (stream 1)") for p in g.problems), g.problems


def test_early_free_is_unsafe_reuse():
    a = DEALLOC_EX.start()                     # no sync_dealloc: t goes back to stream 0's pool while r reads it
    g = DEALLOC_EX.check(a)
    assert not g.ok
    assert [e.kind for e in g.report.errors] == ["unsafe_reuse"]
    (p,) = g.problems
    assert p.startswith("unsafe reuse: t's memory goes back to stream 0's pool") and "r (stream 1)" in p


def test_wait_on_unknown_event():
    a = EX.start()
    insert(a, WAIT, 1, 0, before="add")        # waits before anything records event 1
    insert(a, REC, 1, 1, after="add")
    g = EX.check(a)
    assert "wait_without_record" in [e.kind for e in g.report.errors]
    assert any("waits on an event that no record_event before it records" in p for p in g.problems)


def test_extra_sync():
    a = solve(EX.start())
    insert(a, WAIT, 1, 0, before="add")        # a second wait for the same event
    g = EX.check(a)
    assert g.problems == ["1 sync more than needed (3; the worked solution has 2)"]
    assert (g.syncs, g.best_syncs) == (3, 2) == (count_syncs(a), count_syncs(EX.best()))
    insert(a, WAIT, 1, 0, before="add")
    assert EX.check(a).problems == ["2 syncs more than needed (4; the worked solution has 2)"]


def test_slower_placement():
    a = EX.start()
    insert(a, REC, 1, 1, after="mul")
    insert(a, WAIT, 1, 0, before="neg")        # stream 0 idles before neg instead of before add
    g = EX.check(a)
    assert g.makespan_us == pytest.approx(6.0) and g.best_makespan_us == pytest.approx(4.0)
    assert g.problems == ["makespan 6 µs; the best is 4 µs"]
    move(a, "neg", before="mul")               # moving neg ahead of the wait fixes it
    assert EX.check(a).ok


def test_deleted_work():
    b = GraphBuilder()
    x = b.input("x")
    mul = b.op(aten.mul.Tensor, x, x, stream=1, name="mul")
    b.sync(REC, 1, 1); b.sync(WAIT, 1, 0)
    add = b.op(aten.add.Tensor, mul, x, stream=0, name="add")   # neg dropped
    g = EX.check(b.output(add, mul))
    assert not g.ok and "work missing: 1 × aten.neg.default (the start graph's neg)" in g.problems


def test_extra_work_and_bad_input():
    a = solve(EX.start())
    with a.graph.inserting_after(exmod.node(a, "add")):
        n = a.graph.call_function(aten.neg.default, (exmod.node(a, "add"),))
    n.meta["custom"] = {"stream": 0}
    a.recompile()
    g = check(Exercise("e", "t", two_streams, solve, cost={**COST, n.name: 0.0}), a)
    assert f"extra work: 1 × aten.neg.default (the answer's {n.name})" in g.problems
    g = EX.check(a)                            # the cost table does not know the new node: said, not raised
    assert any(p.startswith("the answer cannot be simulated") for p in g.problems)
    with pytest.raises(StreamnbError):
        EX.check("not a graph")


def test_reorder_hazard_only_when_asked():
    # the wait depends on nothing: program order alone keeps add after it
    ex = Exercise("r", "t", two_streams, solve, reorder=True, cost=COST)
    g = ex.check(ex.best())
    assert [e.kind for e in g.report.errors] == ["reorderable"] and not g.ok
    assert g.problems[0].startswith("reorder hazard on mul: add and mul are ordered only by program order")
    assert EX.check(EX.best()).ok


def test_edit_helpers_refuse_bad_edits():
    gm = two_streams()
    order = [n.name for n in gm.graph.nodes]
    with pytest.raises(StreamnbError, match="after a node that uses it"):
        move(gm, "neg", after="add")
    with pytest.raises(StreamnbError, match="before its inputs"):
        move(gm, "add", before="neg")
    with pytest.raises(StreamnbError, match="use"):
        remove(gm, "neg")
    with pytest.raises(StreamnbError, match="exactly one"):
        insert(gm, WAIT, 1, 0)
    assert [n.name for n in gm.graph.nodes] == order


def test_imports_no_pass():
    src = Path(exmod.__file__).read_text()
    mods = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom) and n.module}
    mine = {m.split(".")[-1] for m in mods if m.startswith("streamnb") or m.startswith(".")}
    assert mine <= {"graph", "streamops", "simulator", "sanitizer"}, mine
