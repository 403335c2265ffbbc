"""streamnb.exercises: the solution passes, and each kind of wrong answer is caught with the problem named. The
exercises are built on the primer's graphs (`streamnb.primer`, chapter 00), not on graphs of their own."""
import re
from functools import partial

import pytest
import torch

import streamnb.exercises as exmod
from loads import modules_loaded_by, run_fresh
from streamnb.exercises import Exercise, Grade, check, count_syncs, insert, move, remove
from streamnb.graph import GraphBuilder, StreamnbError, canonical, streams
from streamnb.primer import ABC_COST, REUSE_COST, abc_graph, reuse_graph

aten = torch.ops.aten
REC, WAIT, DEALLOC = streams.record_event.default, streams.wait_event.default, streams.sync_dealloc.default

# a (stream 1, 5 µs) feeds c (stream 0); b (stream 0, 2 µs) needs nothing from stream 1; outputs are never freed
two_streams = partial(abc_graph, 1)


def solve(gm):
    insert(gm, REC, 2, 1, after="a")
    insert(gm, WAIT, 2, 0, before="c")
    return gm


EX = Exercise("order c after a", "fewest syncs, no slower", two_streams, solve, cost=ABC_COST)


def dealloc_solution(gm):
    "On `reuse_graph()`: a (stream 0) is read by b on stream 1 and freed after it; c on stream 0 allocates meanwhile."
    insert(gm, REC, 9, 1, after="b")
    insert(gm, DEALLOC, 9, 0, exmod.node(gm, "a"), after="c")   # free a only once b is done, after c
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
    insert(a, REC, 2, 1, after="a")            # the record alone orders nothing
    g = check(EX, a)
    assert not g.ok
    # a, made on stream 1, is also returned: the caller reads it on stream 0 unjoined (the worked solution's wait,
    # before c, joins it for both)
    assert g.report is not None and [(e.kind, e.nodes) for e in g.report.errors] == \
        [("race", ("c", "a")), ("unjoined_output", ("output", "a"))]
    assert any(p.startswith("race on a: c (stream 0) and a (stream 1)") and
               p.endswith("Fix: record an event on stream 1 after a and wait for it on stream 0 before c")
               for p in g.problems), g.problems
    assert any(p.startswith("unjoined output: a (made on stream 1) is returned, but nothing makes stream 0") and
               p.endswith("Fix: record an event on stream 1 after a and wait for it on stream 0 before the output")
               for p in g.problems), g.problems


def test_early_free_is_unsafe_reuse():
    a = DEALLOC_EX.start()                     # no sync_dealloc: a goes back to stream 0's pool while b reads it
    g = DEALLOC_EX.check(a)
    assert not g.ok
    # b, made on stream 1, is returned and nothing joins it to stream 0 either: the solution's sync_dealloc (a wait on
    # stream 0 for b's event) orders both the free and the caller's read
    assert [e.kind for e in g.report.errors] == ["unsafe_reuse", "unjoined_output"]
    p, q = g.problems
    assert p.startswith("unsafe reuse: a's memory goes back to stream 0's pool") and "b (stream 1)" in p
    assert "Fix: record an event on stream 1 after b and free a only once it has happened" in p
    assert q.startswith("unjoined output: b (made on stream 1) is returned, but nothing makes stream 0") and "wait for b" in q


def test_wait_on_unknown_event():
    a = EX.start()
    insert(a, WAIT, 2, 0, before="c")          # waits before anything records event 2
    insert(a, REC, 2, 1, after="c")
    g = EX.check(a)
    assert "wait_without_record" in [e.kind for e in g.report.errors]
    assert any("waits on an event that no record_event before it records" in p for p in g.problems)


def test_extra_sync():
    a = solve(EX.start())
    insert(a, WAIT, 2, 0, before="c")          # a second wait for the same event
    g = EX.check(a)
    (p,) = g.problems
    assert p.startswith("1 sync more than needed (3; the worked solution has 2): wait_event_default_1 (wait_event on "
                        "stream 0). Fix: remove")
    assert (g.syncs, g.best_syncs) == (3, 2) == (count_syncs(a), count_syncs(EX.best()))
    insert(a, WAIT, 2, 0, before="c")
    assert EX.check(a).problems[0].startswith("2 syncs more than needed (4; the worked solution has 2)")


def test_slower_placement():
    a = EX.start()
    insert(a, REC, 2, 1, after="a")
    insert(a, WAIT, 2, 0, before="b")          # stream 0 idles before b instead of before c
    g = EX.check(a)
    assert g.makespan_us == pytest.approx(8.0) and g.best_makespan_us == pytest.approx(6.0)
    (p,) = g.problems
    assert p.startswith("makespan 8 µs; the best is 6 µs: node wait_event_default holds stream 0 idle 5 µs") and \
        "Fix: move it later, just before the first node on stream 0 that needs" in p
    move(a, "b", before="a")                   # moving b ahead of the wait fixes it
    assert EX.check(a).ok


def test_deleted_work():
    b = GraphBuilder()
    x = b.input("x")
    a = b.op(aten.mul.Tensor, x, x, stream=1, name="a")
    b.sync(REC, 2, 1); b.sync(WAIT, 2, 0)
    c = b.op(aten.add.Tensor, a, x, stream=0, name="c")   # the start graph's b dropped
    g = EX.check(b.output(c, a))
    assert not g.ok and g.problems[0].startswith("work missing: node b (aten.neg.default) is gone; fix: put it back")


def test_extra_work_and_bad_input():
    a = solve(EX.start())
    with a.graph.inserting_after(exmod.node(a, "c")):
        n = a.graph.call_function(aten.neg.default, (exmod.node(a, "c"),))
    n.meta["custom"] = {"stream": 0}
    a.recompile()
    g = check(Exercise("e", "t", two_streams, solve, cost={**ABC_COST, n.name: 0.0}), a)
    assert f"extra work: node {n.name} (aten.neg.default) is not in the start graph; fix: remove it" in g.problems
    g = EX.check(a)                            # the cost table does not know the new node: said, not raised
    assert any(p.startswith("the answer cannot be simulated") for p in g.problems)
    with pytest.raises(StreamnbError):
        EX.check("not a graph")


def test_reorder_hazard_only_when_asked():
    # the wait depends on nothing: program order alone keeps c after it
    ex = Exercise("r", "t", two_streams, solve, reorder=True, cost=ABC_COST)
    g = ex.check(ex.best())
    # a is returned too: the caller's read of a (the output) hangs on the same loose record
    assert [(e.kind, e.nodes) for e in g.report.errors] == [("reorderable", ("c", "a")), ("reorderable", ("output", "a"))]
    assert not g.ok
    assert g.problems[0].startswith("reorder hazard on a: c and a are ordered only by program order")
    assert g.problems[1].startswith("reorder hazard on a: output and a are ordered only by program order")
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
        insert(gm, WAIT, 2, 0)
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
    assert run_fresh(code).splitlines()[-1] == "False"


# --- every exercise of the course: the worked solution passes, and the wrong answers learners give are caught, each
# with the right reason (the node named, and the fix). Exercises are found in the package, not listed by hand.

import importlib
import inspect
import pkgutil

import streamnb
from streamnb.graph import set_stream

SYNC_EV, SYNC_ST, SYNC_DEV = (streams.synchronize_event.default, streams.synchronize_stream.default,
                              streams.synchronize_device.default)
WAIT_STREAM = streams.wait_stream.default


def all_exercises():
    "Every zero-argument function of the package whose name ends in `_exercise` and that returns an Exercise."
    found = {}
    for m in pkgutil.iter_modules(streamnb.__path__):
        mod = importlib.import_module(f"streamnb.{m.name}")
        for name, f in vars(mod).items():
            if name.endswith("_exercise") and inspect.isfunction(f) and f.__module__ == mod.__name__ \
                    and not inspect.signature(f).parameters:
                ex = f()
                if isinstance(ex, Exercise): found[f"{m.name}.{name}"] = f
    return found


def _edit(*steps):
    "An answer: the exercise's start graph, then `steps` (each a function of the graph)."
    def make(ex):
        gm = ex.start()
        for s in steps: s(gm)
        return gm
    return make


def _ins(target, *args, **where): return lambda gm: insert(gm, target, *args, **where)
def _rm(name): return lambda gm: remove(gm, name)
def _mv(name, **where): return lambda gm: move(gm, name, **where)
def _stream(name, s): return lambda gm: set_stream(exmod.node(gm, name), s)
def _call(f): return lambda gm: f(gm)


def _drop_output(name):
    "Stop returning `name` (a learner's way to silence an unjoined output)."
    def step(gm):
        out = gm.graph.find_nodes(op="output")[0]
        out.args = (tuple(a for a in out.args[0] if getattr(a, "name", None) != name),)
        gm.recompile()
    return step


def _rewire(name, old, new):
    def step(gm):
        n = exmod.node(gm, name)
        n.replace_input_with(exmod.node(gm, old), exmod.node(gm, new))
        gm.recompile()
    return step


def _pipeline(*skip):
    from streamnb.graph import PIPELINE_ORDER
    from streamnb.pipeline import run_stream_passes
    return lambda gm: run_stream_passes(gm, passes=[p for p in PIPELINE_ORDER if p not in skip])


def _wrap(spec):
    from streamnb.control_deps import wrap_by_hand
    return lambda gm: wrap_by_hand(gm, spec)


def _join(gm, event, stream):
    from streamnb.course import join_before_output
    return join_before_output(gm, event, stream)


def _syncs_then(*steps):
    from streamnb.syncs import insert_backward_syncs
    return (*steps, lambda gm: insert_backward_syncs(gm))


HOST = "blocks the host (the CPU waits"
# exercise -> [(the mistake, the answer, what its grade must say: a problem starting with the first string and
# containing the others)]
WRONG = {
    "primer.wait_exercise": [   # the start graph blocks the host with synchronize_stream(1) before b
        ("keep the host sync, just before c", _edit(_mv("synchronize_stream_default", before="c")),
         ["node synchronize_stream_default: synchronize_stream " + HOST,
          "the worked solution never blocks the host. Fix: remove it and let the streams wait instead of the CPU: "
          "record_event(e, 1) after a, then wait_event(e, 0) before c"]),
        ("synchronize_event instead", _edit(_rm("synchronize_stream_default"), _ins(REC, 7, 1, after="a"),
                                            _ins(SYNC_EV, 7, before="c")),
         ["node synchronize_event_default: synchronize_event " + HOST, "until event 7 has happened"]),
        ("synchronize_device instead", _edit(_rm("synchronize_stream_default"), _ins(SYNC_DEV, "cuda", 0, before="c")),
         ["node synchronize_device_default: synchronize_device " + HOST, "until every stream has finished"]),
        ("a record and no wait", _edit(_rm("synchronize_stream_default"), _ins(REC, 7, 1, after="a")),
         ["race on a: c (stream 0) and a (stream 1)", "wait for it on stream 0 before c"]),
        ("the wait before b", _edit(_rm("synchronize_stream_default"), _ins(REC, 7, 1, after="a"),
                                    _ins(WAIT, 7, 0, before="b")),
         ["makespan 8 µs; the best is 6 µs: node wait_event_default holds stream 0 idle",
          "Fix: move it later, just before the first node on stream 0 that needs event 7 (c: "
          "move(gm, 'wait_event_default', before='c'))"]),
        ("stop returning a", _edit(_rm("synchronize_stream_default"), _ins(REC, 7, 1, after="a"),
                                   _ins(WAIT, 7, 0, before="c"), _drop_output("a")),
         ["work changed: node output returns c instead of c, a; fix: return c, a again"]),
    ],
    "course.acc_exercise": [
        # correction 17 joins the returned side-stream values (neg on 1, mm on 2) to stream 0: the worked solution has
        # 5 syncs (record neg, wait on 2, record after mm, and a wait on 0 for each), each wrong answer 8
        ("acc on the main stream", _edit(*_syncs_then(_stream("acc", 0))),
         ["3 syncs more than needed (8; the worked solution has 5)", "Fix: remove"]),
        ("acc on neg's stream", _edit(*_syncs_then(_stream("acc", 1))),
         ["3 syncs more than needed (8; the worked solution has 5)", "wait_event_default (wait_event on stream 1)"]),
        ("acc on stream 2, no syncs", _edit(_stream("acc", 2)),
         ["race on neg: acc (stream 2) and neg (stream 1)", "before acc"]),
    ],
    "course.sync_exercise": [   # neg (stream 1) read by mul (stream 0), sin and cos (stream 2)
        ("one host sync", _edit(_ins(SYNC_ST, 1, after="neg")),
         ["node synchronize_stream_default: synchronize_stream " + HOST,
          "record_event(e, 1) after neg, then wait_event(e, 0) before mul and wait_event(e, 2) before sin"]),
        ("sin and cos read tangents_1", _edit(_rewire("sin", "neg", "tangents_1"), _rewire("cos", "neg", "tangents_1"),
                                              _ins(REC, 3, 1, after="neg"), _ins(WAIT, 3, 0, before="mul")),
         ["work changed: node sin reads tangents_1 instead of neg", "fix: make it read neg again"]),
        ("sin and cos moved to neg's stream", _edit(_stream("sin", 1), _stream("cos", 1),
                                                    _ins(REC, 3, 1, after="neg"), _ins(WAIT, 3, 0, before="mul")),
         ["work changed: node sin runs on stream 1 instead of stream 2", "put it back on stream 2"]),
        # sin and cos (stream 2) are returned: joined to stream 0 as the task says, so the extra wait is the only mistake;
        # the worked solution (correction 17) has 5 syncs: 3, and the join's record and wait
        ("a wait per consumer", _edit(_ins(REC, 3, 1, after="neg"), _ins(WAIT, 3, 0, before="mul"),
                                      _ins(WAIT, 3, 2, before="sin"), _ins(WAIT, 3, 2, before="cos"),
                                      _ins(REC, 4, 2, after="cos"), _call(lambda gm: _join(gm, 4, 0))),
         ["1 sync more than needed (6; the worked solution has 5): wait_event_default_2 (wait_event on stream 2)"]),
        ("stream 2 forgotten", _edit(_ins(REC, 3, 1, after="neg"), _ins(WAIT, 3, 0, before="mul")),
         ["race on neg: sin (stream 2) and neg (stream 1)", "wait for it on stream 2 before sin"]),
    ],
    "course.dealloc_exercise": [   # the seed's sync_dealloc_default right after mm's record: stream 0 stalls
        ("left where the seed puts it", _edit(),
         ["makespan", "node sync_dealloc_default holds stream 0 idle", "to where event 3 (recorded after mm) has already "
          "happened when stream 0 reaches it: after the first kernel of stream 0 that ends once mm has ended"]),
        ("at the very end", _edit(_mv("sync_dealloc_default", before="output")),
         ["node sync_dealloc_default: frees mul only after add_6, later than needed", "Fix: move(gm, 'sync_dealloc_default', after="]),
        ("removed", _edit(_rm("sync_dealloc_default")),
         ["unsafe reuse: mul's memory goes back to stream 0's pool", "mm (stream 1)"]),
        ("one add too early", _edit(_mv("sync_dealloc_default", after="add_3")),
         ["makespan 43.18 µs; the best is 40.06 µs: node sync_dealloc_default holds stream 0 idle 3.12 µs",
          "after the first kernel of stream 0 that ends once mm has ended"]),
        ("two adds late", _edit(_mv("sync_dealloc_default", after="add_5")),
         ["node sync_dealloc_default: frees mul only after add_5, later than needed",
          "move(gm, 'sync_dealloc_default', after='add_4')"]),
    ],
    "course.control_deps_exercise": [
        ("nothing wrapped", _edit(),
         ["reorder hazard on p: c0 and p are ordered only by program order", "wrap the syncs between them in control_deps"]),
        ("only the record", _edit(_wrap({"record_event_default": ["p"]})),
         ["reorder hazard on p:", "thread p through the wait"]),
        ("the record and the first wait", _edit(_wrap({"record_event_default": ["p"],
                                                       "wait_event_default": ["record_event_default", "p"]})),
         ["reorder hazard on p: c2 and", "thread p through the wait before c2"]),
        ("the seed's deps (the chapter's first attempt)",
         _edit(_wrap({"record_event_default": ["p"], "wait_event_default": ["record_event_default"],
                      "wait_event_default_1": ["record_event_default"], "record_event_default_1": ["c2"],
                      "wait_event_default_2": ["record_event_default_1", "c0"]})),
         ["reorder hazard on p:", "thread p through the wait"]),
    ],
    "course.wrapper_exercise": [   # copy_ writes back mul (stream 1), copy__1 add (stream 0)
        ("no waits", _edit(), ["race on mul: copy_ (stream 0) and mul (stream 1)", "before copy_"]),
        ("waits for the wrong stream", _edit(_ins(WAIT_STREAM, 0, 2, before="copy_")),
         ["race on mul: copy_ (stream 0) and mul (stream 1)"]),
        # the start graph already joins sin (stream 2, returned) to stream 0 with wait_stream_default: one sync more on
        # both sides, and the second wait for stream 1 is the one too many
        ("a wait before each copy", _edit(_ins(WAIT_STREAM, 0, 1, before="copy_"), _ins(WAIT_STREAM, 0, 1, before="copy__1")),
         ["1 sync more than needed (3; the worked solution has 2): wait_stream_default_2 (wait_stream on stream 0, stream 1)"]),
        ("synchronize the device first", _edit(_ins(SYNC_DEV, "cuda", 0, before="copy_")),
         ["node synchronize_device_default: synchronize_device " + HOST, "wait_event(e, 0) before copy_"]),
    ],
    "course.pipeline_exercise": [
        ("no passes", _edit(), ["race on ln2_grad: x1_grad (stream 0) and ln2_grad (stream 2)"]),
        ("without control_deps", _edit(_pipeline("wrap_all_sync_nodes_with_control_deps")),
         ["reorder hazard on ln2_grad: x1_grad and ln2_grad", "control_deps"]),
        ("without the dealloc pass", _edit(_pipeline("sync_deallocations")),
         ["unsafe reuse: scale_grad's memory goes back to stream 0's pool"]),   # (ln2_grad's: ordered before stream 2's
                                                                                  # next kernel, the graph's end)
    ],
    "minsync.fewest_syncs_exercise": [
        # c2, returned from stream 2, is joined to stream 0 (correction 17): a record and a wait more on both sides
        ("left as it is", _edit(), ["1 sync more than needed (13; the worked solution has 12): wait_event_default_1"]),
        ("a needed wait removed", _edit(_rm("wait_event_default")),
         ["race on q: c1 (stream 2) and q (stream 1)", "before c1"]),
        ("waits swapped for a host sync", _edit(_rm("wait_event_default"), _rm("wait_event_default_1"),
                                                _ins(SYNC_EV, 100, before="c1")),
         ["node synchronize_event_default: synchronize_event " + HOST]),
    ],
}


def test_every_exercise_has_wrong_answers():
    assert set(all_exercises()) == set(WRONG), set(all_exercises()) ^ set(WRONG)
    assert all(len(v) >= 3 for v in WRONG.values())


@pytest.mark.parametrize("name", sorted(WRONG))
def test_worked_solution_and_wrong_answers(name):
    ex = all_exercises()[name]()
    g = ex.check(ex.best())
    assert g.ok, str(g)
    for mistake, make, (first, *rest) in WRONG[name]:
        g = ex.check(make(ex))
        hit = [p for p in g.problems if p.startswith(first)]
        assert not g.ok and hit, f"{name}, {mistake}: not caught as {first!r}:\n{g}"
        assert all(any(r in p for p in hit) for r in rest), f"{name}, {mistake}: {rest} not said:\n{g}"


def test_every_problem_names_a_node_and_a_fix():
    "Every problem of every wrong answer above names a node of the answer and says what to do."
    for name, cases in WRONG.items():
        ex = all_exercises()[name]()
        for mistake, make, _ in cases:
            gm = make(ex)
            names = {n.name for n in gm.graph.nodes}
            for p in ex.check(gm).problems:
                assert "Fix" in p or "fix" in p, f"{name}, {mistake}: no fix in {p!r}"
                assert any(re.search(rf"\b{re.escape(n)}\b", p) for n in names), f"{name}, {mistake}: no node in {p!r}"


def test_unjoined_output_in_words_names_an_in_place_writer():
    "A returned tensor last written in place on a side stream: the sentence names the writer and the tensor apart."
    import torch
    from streamnb.exercises import in_words
    from streamnb.graph import GraphBuilder, streams
    from streamnb.sanitizer import sanitize
    b = GraphBuilder()
    x = b.input("x")
    y = b.op(torch.ops.aten.mul.Tensor, x, x, stream=0)
    b.sync(streams.record_event.default, 5, 0); b.sync(streams.wait_event.default, 5, 1)   # stream 1 waits for mul
    b.op(torch.ops.aten.add_.Tensor, y, 1, stream=1)        # writes y in place on stream 1
    (e,) = sanitize(b.output(y), current_streams={0}).errors
    assert e.kind == "unjoined_output"
    assert in_words(e) == ("unjoined output: add_ writes mul on stream 1 and the graph returns mul, but nothing makes "
                           "stream 0 (where the caller reads it) wait for add_. Fix: record an event on stream 1 after "
                           "add_ and wait for it on stream 0 before the output")


def test_a_named_move_fixes_the_answer():
    "Where a grade's fix is a `move(gm, ...)`, doing exactly that makes the answer correct."
    done = 0
    for name, cases in WRONG.items():
        ex = all_exercises()[name]()
        for mistake, make, _ in cases:
            gm = make(ex)
            for p in ex.check(gm).problems:
                for what, side, where in re.findall(r"move\(gm, '(\w+)', (before|after)='(\w+)'\)", p):
                    fixed = make(ex)
                    move(fixed, what, **{side: where})
                    assert ex.check(fixed).ok, f"{name}, {mistake}: the fix {what} {side} {where} is not enough:\n{ex.check(fixed)}"
                    done += 1
    assert done >= 3, done   # the primer's early wait, chapter 12's two late frees


def test_other_right_answers_pass():
    "The graders judge what an answer does, not whether it copies the worked solution: fewer syncs, no host block, passes."
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    a = ex.start()
    remove(a, "synchronize_stream_default")
    insert(a, WAIT_STREAM, 0, 1, before="c")          # s0.wait_stream(s1) just before c: one op, stream-side
    g = ex.check(a)
    assert g.ok and (g.syncs, g.best_syncs) == (1, 2), str(g)


def test_host_blocking_is_judged_without_the_timing_model(monkeypatch):
    "A host sync is wrong even if the simulator says it costs nothing: the verdict reads the graph's stream ops."
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    a = ex.start()
    move(a, "synchronize_stream_default", before="c")
    assert exmod.makespan_us(a, ex.cost) == pytest.approx(exmod.makespan_us(ex.best(), ex.cost))   # same makespan
    monkeypatch.setattr(exmod, "slow_problems", lambda *a, **k: [])    # whatever the timing says
    (p,) = ex.check(a).problems
    assert p.startswith("node synchronize_stream_default: synchronize_stream blocks the host")


def test_slower_without_a_longer_wait_names_the_late_node():
    "A slower answer whose waits are no longer than the worked solution's: the first kernel that starts late is named."
    a = solve(EX.start())
    move(a, "b", after="wait_event_default")             # b issued behind the wait: it starts when a ends
    (p,) = EX.check(a).problems
    # the wait itself now idles stream 0 longer (b's 2 µs no longer fill it): named as the wait
    assert p.startswith("makespan 8 µs; the best is 6 µs: node wait_event_default holds stream 0 idle"), p
    c = exmod.slow_problems(EX.best(), a, EX.cost)
    assert c == [p]
    tl_best, tl = exmod.simulate(EX.best(), cost=EX.cost), exmod.simulate(a, cost=EX.cost)
    assert tl.spans["b"][1] > tl_best.spans["b"][1]
    assert exmod._later(EX.best(), a, EX.cost).startswith(": node b starts at 5 µs instead of 0 µs. Fix: issue it")


def _apply_fixes(ex, gm, grade):
    for e in grade.fixes:
        gm = e.apply(gm)
    return gm


# wrong answers whose mending is to run a pass again, not an edit of the graph: chapter 10's answer is a stream for
# `acc` and then `insert_backward_syncs`; chapter 15's a pipeline with a pass left out
NOT_MECHANICAL = {("course.acc_exercise", "acc on the main stream"), ("course.acc_exercise", "acc on neg's stream"),
                  ("course.acc_exercise", "the start graph"), ("course.pipeline_exercise", "the start graph"),
                  ("course.pipeline_exercise", "no passes"), ("course.pipeline_exercise", "without control_deps"),
                  ("course.pipeline_exercise", "without the dealloc pass")}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_applying_every_printed_fix_in_order_gives_a_correct_answer(name):
    "Each wrong answer: the grade's fixes, applied in order as printed, make it correct (combined per stream pair)."
    ex = all_exercises()[name]()
    for mistake, make, _ in [*WRONG[name], ("the start graph", _edit(), None)]:
        if (name, mistake) in NOT_MECHANICAL or ex.check(make(ex), fixes=False).ok: continue
        g = ex.check(make(ex))
        assert g.fixes and g.fixed, f"{name}, {mistake}: no complete fix:\n{g}"
        assert "fix, in order" in str(g) and all(str(e) in str(g) for e in g.fixes)
        fixed = ex.check(_apply_fixes(ex, make(ex), g))
        assert fixed.ok, f"{name}, {mistake}: the fixes\n{g}\ngive\n{fixed}"


@pytest.mark.parametrize("edits, said", [
    ((_ins(REC, 7, 0, after="b"), _ins(WAIT, 7, 0, before="c")),
     "(a wrong sync: wait_event_default waits for event 7, recorded by record_event_default on stream 0, not on stream 1)"),
    ((_ins(REC, 7, 1, after="a"), _ins(WAIT, 7, 1, before="c")),
     "(a wrong sync: wait_event_default waits for event 7 (recorded after a) on stream 1, not on stream 0, where c runs)"),
    ((_ins(REC, 7, 1, before="a"), _ins(WAIT, 7, 0, before="c")),
     "(a wrong sync: wait_event_default waits for event 7, recorded by record_event_default before a: it marks stream 1's "
     "work before a)"),
])
def test_a_present_but_wrong_sync_is_named(edits, said):
    "A record/wait pair that is there but orders the wrong thing: the race names the wait and what is wrong with it."
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    a = _edit(_rm("synchronize_stream_default"), *edits)(ex)
    g = ex.check(a)
    assert any(p.startswith("race on a: c (stream 0) and a (stream 1)") and said in p for p in g.problems), str(g)
    assert g.fixed and ex.check(_apply_fixes(ex, _edit(_rm("synchronize_stream_default"), *edits)(ex), g)).ok


def test_a_host_sync_as_the_output_join_is_replaced_not_just_removed():
    "A host sync that only joins the outputs: its fix waits before the output instead (removing it leaves them unjoined)."
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    make = _edit(_rm("synchronize_stream_default"), _ins(REC, 7, 1, after="a"), _ins(WAIT, 7, 0, before="c"),
                 _rm("wait_event_default"), _ins(SYNC_ST, 1, before="c"))   # the host sync orders c and the output
    g = ex.check(make(ex))
    assert any("before c" in p and p.startswith("node synchronize_stream_default_1: synchronize_stream blocks the host")
               for p in g.problems), str(g)
    assert ex.check(_apply_fixes(ex, make(ex), g)).ok
    only_join = _edit(_mv("synchronize_stream_default", before="output"))(ex)   # c unordered too
    assert any("wait_event(e, 0) before output" in p for p in ex.check(only_join).problems), str(ex.check(only_join))


def test_pre_answer_attempts_show_problems_not_fixes():
    from streamnb.primer import wait_exercise
    ex = wait_exercise()
    g = ex.check(ex.start())
    text = g.without_fixes()
    assert "Fix" not in text and "fix" not in text and "insert(" not in text, text
    assert len(text.splitlines()) == 1 + len(g.problems)


def test_the_course_graphs_use_indices_torch_could_run():
    "Every exercise's start graph and worked solution, and the primer's graphs: no index both an event and a stream."
    from streamnb.primer import ABC_SYNCS, abc_graph, reuse_graph, PROTECTIONS
    from streamnb.streamops import check_stream_ops
    graphs = [g for f in all_exercises().values() for g in (f().start(), f().best())]
    graphs += [abc_graph(1, s, early=e) for s in ABC_SYNCS for e in (False, True)]
    graphs += [reuse_graph(protect=p) for p in (None, *PROTECTIONS)]
    for gm in graphs: check_stream_ops(gm)
