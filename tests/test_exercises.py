"""streamnb.exercises: the solution passes, and each kind of wrong answer is caught with the problem named. The
exercises are built on the primer's graphs (`streamnb.primer`, chapter 00), not on graphs of their own."""
import subprocess
import sys
from functools import partial

import pytest
import torch

import streamnb.exercises as exmod
from loads import modules_loaded_by
from streamnb.exercises import Exercise, Grade, check, count_syncs, insert, move, remove
from streamnb.graph import GraphBuilder, StreamnbError, canonical, streams
from streamnb.primer import ABC_COST, REUSE_COST, abc_graph, reuse_graph

aten = torch.ops.aten
REC, WAIT, DEALLOC = streams.record_event.default, streams.wait_event.default, streams.sync_dealloc.default

# a (stream 1, 5 µs) feeds c (stream 0); b (stream 0, 2 µs) needs nothing from stream 1; outputs are never freed
two_streams = partial(abc_graph, 1)


def solve(gm):
    insert(gm, REC, 1, 1, after="a")
    insert(gm, WAIT, 1, 0, before="c")
    return gm


EX = Exercise("order c after a", "fewest syncs, no slower", two_streams, solve, cost=ABC_COST)


def dealloc_solution(gm):
    "On `reuse_graph()`: a (stream 0) is read by b on stream 1 and freed after it; c on stream 0 allocates meanwhile."
    insert(gm, REC, 2, 1, after="b")
    insert(gm, DEALLOC, 2, 0, exmod.node(gm, "a"), after="c")   # free a only once b is done, after c
    return gm


DEALLOC_EX = Exercise("free a safely", "a is read on stream 1: free it without a race and without a stall",
                      reuse_graph, dealloc_solution, cost=REUSE_COST)


def test_solutions_pass():
    for ex in (EX, DEALLOC_EX):
        g = ex.check(ex.best())
        assert isinstance(g, Grade) and g.ok, str(g)
        assert g.problems == [] and g.syncs == g.best_syncs
        assert g.makespan_us == pytest.approx(g.best_makespan_us)
        assert str(g).splitlines()[0] == f"{ex.title}: correct"
    assert EX.check(EX.best()).makespan_us == pytest.approx(6.0)
    assert canonical(DEALLOC_EX.best()) == canonical(reuse_graph(protect="sync_dealloc"))   # the primer's protection


def test_missing_wait_is_a_race():
    a = EX.start()
    insert(a, REC, 1, 1, after="a")            # the record alone orders nothing
    g = check(EX, a)
    assert not g.ok
    assert g.report is not None and [e.kind for e in g.report.errors] == ["race"]
    assert any(p.startswith("race on a: c (stream 0) and a (stream 1)") for p in g.problems), g.problems


def test_early_free_is_unsafe_reuse():
    a = DEALLOC_EX.start()                     # no sync_dealloc: a goes back to stream 0's pool while b reads it
    g = DEALLOC_EX.check(a)
    assert not g.ok
    assert [e.kind for e in g.report.errors] == ["unsafe_reuse"]
    (p,) = g.problems
    assert p.startswith("unsafe reuse: a's memory goes back to stream 0's pool") and "b (stream 1)" in p


def test_wait_on_unknown_event():
    a = EX.start()
    insert(a, WAIT, 1, 0, before="c")          # waits before anything records event 1
    insert(a, REC, 1, 1, after="c")
    g = EX.check(a)
    assert "wait_without_record" in [e.kind for e in g.report.errors]
    assert any("waits on an event that no record_event before it records" in p for p in g.problems)


def test_extra_sync():
    a = solve(EX.start())
    insert(a, WAIT, 1, 0, before="c")          # a second wait for the same event
    g = EX.check(a)
    assert g.problems == ["1 sync more than needed (3; the worked solution has 2)"]
    assert (g.syncs, g.best_syncs) == (3, 2) == (count_syncs(a), count_syncs(EX.best()))
    insert(a, WAIT, 1, 0, before="c")
    assert EX.check(a).problems == ["2 syncs more than needed (4; the worked solution has 2)"]


def test_slower_placement():
    a = EX.start()
    insert(a, REC, 1, 1, after="a")
    insert(a, WAIT, 1, 0, before="b")          # stream 0 idles before b instead of before c
    g = EX.check(a)
    assert g.makespan_us == pytest.approx(8.0) and g.best_makespan_us == pytest.approx(6.0)
    assert g.problems == ["makespan 8 µs; the best is 6 µs"]
    move(a, "b", before="a")                   # moving b ahead of the wait fixes it
    assert EX.check(a).ok


def test_deleted_work():
    b = GraphBuilder()
    x = b.input("x")
    a = b.op(aten.mul.Tensor, x, x, stream=1, name="a")
    b.sync(REC, 1, 1); b.sync(WAIT, 1, 0)
    c = b.op(aten.add.Tensor, a, x, stream=0, name="c")   # the start graph's b dropped
    g = EX.check(b.output(c, a))
    assert not g.ok and "work missing: 1 × aten.neg.default (the start graph's b)" in g.problems


def test_extra_work_and_bad_input():
    a = solve(EX.start())
    with a.graph.inserting_after(exmod.node(a, "c")):
        n = a.graph.call_function(aten.neg.default, (exmod.node(a, "c"),))
    n.meta["custom"] = {"stream": 0}
    a.recompile()
    g = check(Exercise("e", "t", two_streams, solve, cost={**ABC_COST, n.name: 0.0}), a)
    assert f"extra work: 1 × aten.neg.default (the answer's {n.name})" in g.problems
    g = EX.check(a)                            # the cost table does not know the new node: said, not raised
    assert any(p.startswith("the answer cannot be simulated") for p in g.problems)
    with pytest.raises(StreamnbError):
        EX.check("not a graph")


def test_reorder_hazard_only_when_asked():
    # the wait depends on nothing: program order alone keeps c after it
    ex = Exercise("r", "t", two_streams, solve, reorder=True, cost=ABC_COST)
    g = ex.check(ex.best())
    assert [e.kind for e in g.report.errors] == ["reorderable"] and not g.ok
    assert g.problems[0].startswith("reorder hazard on a: c and a are ordered only by program order")
    assert EX.check(EX.best()).ok


def test_edit_helpers_refuse_bad_edits():
    gm = two_streams()
    order = [n.name for n in gm.graph.nodes]
    with pytest.raises(StreamnbError, match="after a node that uses it"):
        move(gm, "b", after="c")
    with pytest.raises(StreamnbError, match="before its inputs"):
        move(gm, "c", before="b")
    with pytest.raises(StreamnbError, match="use"):
        remove(gm, "b")
    with pytest.raises(StreamnbError, match="exactly one"):
        insert(gm, WAIT, 1, 0)
    assert [n.name for n in gm.graph.nodes] == order


def test_imports_no_pass():
    loaded = modules_loaded_by("exercises")
    assert {"exercises", "sanitizer", "simulator", "streamops", "graph"} <= loaded
    assert not loaded & {"assign", "syncs", "dealloc", "control_deps", "metadata", "pipeline"}, loaded


def test_course_sits_on_top():
    "`streamnb.course` (the pass chapters' exercises) loads the graders and the passes, and no other module loads it."
    assert {"exercises", "examples", "assign", "syncs", "dealloc", "control_deps", "metadata", "pipeline"} <= \
        modules_loaded_by("course")
    code = ("import importlib, pkgutil, sys, streamnb\n"
            "for m in pkgutil.iter_modules(streamnb.__path__):\n"
            "    if m.name != 'course': importlib.import_module('streamnb.' + m.name)\n"
            "print('streamnb.course' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-1] == "False"
