"""Tests for streamnb.pipeline.run_stream_passes: order, arguments, both modes, idempotence, lint."""
import operator
import warnings
from types import SimpleNamespace

import pytest
import torch

import graphgen
import streamnb.pipeline as pipeline
from streamnb.graph import AlreadyProcessedWarning, GraphBuilder, StreamRegistry, canonical, is_control_deps, use_registry
from streamnb.pipeline import run_stream_passes

aten = torch.ops.aten
streams = torch.ops.streams
ORDER = ["assign_backward_streams", "assign_epilogue_copy_streams", "insert_backward_syncs", "sync_deallocations",
         "wrap_all_sync_nodes_with_control_deps", "populate_fw_metadata_with_stream_indices"]


def small_backward():
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    w = b.input("primals_2", tag="is_forward")
    t = b.input("tangents_1")
    mul = b.op(aten.mul.Tensor, t, x, stream=1)
    mul_1 = b.op(aten.mul.Tensor, t, w, stream=0)
    acc = b.op(aten.add.Tensor, mul, mul_1, acc=True)
    neg = b.op(aten.neg.default, mul, stream=0)
    return b.output(acc, neg)


def run(gm, **kw):
    with use_registry(StreamRegistry(start=10, current_stream=0)):
        return run_stream_passes(gm, **kw)


@pytest.fixture
def calls(monkeypatch):
    "Replace every pass in streamnb.pipeline's table by a recorder."
    got = []
    for name in ORDER:
        monkeypatch.setitem(pipeline.STREAM_PASSES, name, lambda *a, _n=name, **k: got.append((_n, a, k)))
    return got


def test_order_and_arguments(calls):
    gm, meta = small_backward(), SimpleNamespace(num_mutated_inp_runtime_indices=0)
    out = run_stream_passes(gm, upstream=True, fw_metadata=meta, mechanism="record_stream", device="A100")
    assert out is gm
    assert [c[0] for c in calls] == ORDER
    assert all(c[1][0] is gm and c[2]["upstream"] is True for c in calls)
    assert calls[3][2] == dict(upstream=True, mechanism="record_stream", device="A100")
    assert calls[5][1] == (gm, meta)


def test_no_metadata_pass_without_fw_metadata(calls):
    run_stream_passes(small_backward())
    assert [c[0] for c in calls] == ORDER[:-1]
    assert all(c[2]["upstream"] is False for c in calls)


def test_passes_and_steps(calls):
    "`passes` picks from the table and keeps its order; an `after` step runs right after its pass, only if it ran."
    gm, steps = small_backward(), []
    step = lambda name: (lambda g: steps.append((name, len(calls), g)))
    run_stream_passes(gm, passes=["sync_deallocations", "assign_backward_streams"],
                      after={"assign_backward_streams": step("a"), "insert_backward_syncs": step("i")})
    assert [c[0] for c in calls] == ["assign_backward_streams", "sync_deallocations"]
    assert steps == [("a", 1, gm)]
    for bad in (dict(passes=["minimize_syncs"]), dict(after={"populate_fw_metadata_with_stream_indices": print})):
        with pytest.raises(pipeline.StreamnbError, match="unknown joint-graph pass"): run_stream_passes(gm, **bad)
    with pytest.raises(pipeline.StreamnbError, match="unknown stream pass"): pipeline.run_pass(gm, "assign_streams")


def test_processed_graph():
    gm = run(small_backward())
    gm.graph.lint()
    assert not any(n.target in (streams.record_event.default, streams.wait_event.default)
                   for n in gm.graph.nodes if n.op == "call_function")       # all wrapped
    # 6 as before + 2: add (stream 1) is returned, so correction 17 joins it to the caller's stream 0 (a record after
    # add, a wait right before the output), both wrapped
    assert sum(is_control_deps(n) for n in gm.graph.nodes) == 8
    out = gm.graph.find_nodes(op="output")[0]
    assert is_control_deps(out.prev) and out.prev.args[1].target.startswith("subgraph_wait_event")
    assert next(n for n in gm.graph.nodes if n.name == "add").meta["custom"]["stream"] == 1   # grad acc assigned
    assert sum(n.target is streams.sync_dealloc.default for n in gm.graph.nodes) == 2


def test_modes_differ_on_running_example_and_agree_where_seed_is_right():
    assert canonical(run(small_backward())) != canonical(run(small_backward(), upstream=True))

    # where the seed is right: the consumer reads a value of its own stream from before the wait (correction 6 has
    # nothing to do), and no tensor is freed off its stream (no sync_dealloc, which correction 9 always changes)
    def own_stream_inputs(mul_is_output=True):
        b = GraphBuilder()
        x, t = b.input("primals_1", tag="is_forward"), b.input("tangents_1")
        mul = b.op(aten.mul.Tensor, t, x, stream=1)
        sin = b.op(aten.sin.default, t, stream=0)
        add = b.op(aten.add.Tensor, mul, sin, stream=0)
        return b.output(add, mul) if mul_is_output else b.output(add)
    assert canonical(run(own_stream_inputs())) == canonical(run(own_stream_inputs(), upstream=True))
    # freed off its stream: a sync_dealloc, which reads the record's getitem by default only
    a, up = run(own_stream_inputs(False)), run(own_stream_inputs(False), upstream=True)
    dealloc_inputs = [[n.args[2].args[0] for n in g.graph.nodes if n.target is streams.sync_dealloc.default] for g in (a, up)]
    assert [len(d) for d in dealloc_inputs] == [1, 1]
    assert [d[0].args[0][0].name if is_control_deps(d[0]) else None for d in dealloc_inputs] == ["add", "mul"]


@pytest.mark.parametrize("upstream", [True, False])
def test_second_run_is_harmless(upstream):
    gm = run(small_backward(), upstream=upstream)
    before = canonical(gm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(gm, upstream=upstream)
    assert canonical(gm) == before
    warned = {str(w.message).split(":")[0] for w in caught if w.category is AlreadyProcessedWarning}
    assert warned == set(ORDER[:-1])


def test_fw_metadata_filled_last():
    meta = SimpleNamespace(num_mutated_inp_runtime_indices=2)
    run(small_backward(), fw_metadata=meta)
    assert meta.mutated_inp_stream_indices == [1, 0]


def test_dce_removes_only_unused_getitems():
    def make():
        b = GraphBuilder()
        x, t = b.input("primals_1", tag="is_forward"), b.input("tangents_1")
        f = b.op(aten.sin.default, x, stream=1, tag="is_forward")
        b.sync(streams.record_event.default, 5, 1, tag="is_forward")   # a user's forward record: f passes through it
        mul = b.op(aten.mul.Tensor, t, x, stream=1)
        return b.output(f, b.op(aten.neg.default, mul, stream=0))
    kept, cleaned = run(make()), run(make(), dce=True)
    names = {n.name for n in cleaned.graph.nodes}
    removed = [n for n in kept.graph.nodes if n.name not in names]
    assert removed and all(n.target is operator.getitem and not n.users for n in removed)
    cleaned.graph.lint()


@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("upstream", [True, False])
def test_random_graphs_lint_and_rerun(seed, upstream):
    make = lambda: graphgen.random_backward_graph(seed, n_nodes=20, p_user_sync=0.0)
    gm = run(make(), upstream=upstream)
    gm.graph.lint()
    before = canonical(gm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AlreadyProcessedWarning)
        run(gm, upstream=upstream)
    assert canonical(gm) == before


def unordered_pairs(gm):
    "(wait, consumer) pairs where a cross-stream consumer after a wait does not depend on it (see test_control_deps)."
    from test_control_deps import ancestors, cross_stream_consumers, origins
    return [(c, n) for c, n in cross_stream_consumers(gm, origins(gm)) if c not in ancestors(n)]


def test_default_pipeline_orders_every_consumer_after_its_wait():
    seed_bad = 0
    for seed in range(20):
        make = lambda: graphgen.random_backward_graph(seed, n_nodes=25, p_user_sync=0.0, p_unannotated=0.0)
        assert unordered_pairs(run(make())) == []
        seed_bad += len(unordered_pairs(run(make(), upstream=True)))
    assert seed_bad > 0   # the seed's pipeline leaves such consumers (so the check can fail)


# ---------------------------------------------------------------- 15_pipeline on the shared running example

def both_pipelines():
    from streamnb.examples import running_example as shared
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        return run_stream_passes(shared(), upstream=True), run_stream_passes(shared())


def test_seed_vs_default_picture_on_the_running_example():
    "The chapter's picture: the seed's panel has wo_grad's race and scale_grad's early free; the default's neither."
    from streamnb.sanitizer import sanitize
    from streamnb.simulator import simulate
    seed, ours = both_pipelines()
    assert sanitize(seed).kinds == ["race", "unsafe_reuse"]
    assert sanitize(ours).kinds == [] and sanitize(ours, reorder=True).kinds == []
    assert "reorderable" in sanitize(seed, reorder=True).kinds
    ts, to = simulate(seed), simulate(ours)
    assert [(r.consumer, r.producer, r.overlaps) for r in ts.unordered_reads] == [("wo_grad", "scale_grad", True)]
    assert ts.spans["wo_grad"][1] < ts.spans["scale_grad"][2]                    # the red outline: it starts too early
    (u,) = ts.unsafe_frees
    assert (u.tensor, u.reader) == ("scale_grad", "attn_grad") and u.read_end > u.freed_at
    assert to.unordered_reads == [] and to.unsafe_frees == []
    assert to.spans["wo_grad"][1] >= to.spans["scale_grad"][2]
    assert to.makespan == pytest.approx(ts.makespan)


def test_pass_by_pass_on_the_running_example():
    from streamnb.assign import assign_backward_streams, assign_epilogue_copy_streams
    from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps
    from streamnb.dealloc import sync_deallocations
    from streamnb.examples import running_example as shared
    from streamnb.sanitizer import sanitize
    from streamnb.syncs import insert_backward_syncs
    gm, found = shared(), []
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        for p in (assign_backward_streams, assign_epilogue_copy_streams, insert_backward_syncs, sync_deallocations,
                  wrap_all_sync_nodes_with_control_deps):
            p(gm)
            found.append(set(sanitize(gm, reorder=True).kinds))
    assert "race" in found[1] and "race" not in found[2] and "unsafe_reuse" in found[2]
    assert not found[3] & {"race", "unsafe_reuse"} and found[4] == set()
    assert canonical(gm) == canonical(both_pipelines()[1])


def test_order_exercise_solution_and_wrong_answers():
    from streamnb.assign import assign_backward_streams, assign_epilogue_copy_streams
    from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps
    from streamnb.dealloc import sync_deallocations
    from streamnb.course import pipeline_exercise
    from streamnb.syncs import insert_backward_syncs
    ex = pipeline_exercise()                                   # 15_pipeline's exercise, as the chapter exports it

    def pipeline(*passes):
        gm = ex.start()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", AlreadyProcessedWarning)
            for p in passes: p(gm)
        return gm

    solution = pipeline(assign_backward_streams, assign_epilogue_copy_streams, insert_backward_syncs,
                        sync_deallocations, wrap_all_sync_nodes_with_control_deps)
    assert ex.check(solution).ok
    wrapped_first = ex.check(pipeline(assign_backward_streams, insert_backward_syncs,
                                      wrap_all_sync_nodes_with_control_deps, sync_deallocations))
    assert not wrapped_first.ok and {p.split(":")[0] for p in wrapped_first.problems} == {"unsafe reuse",
                                                                                            "reorder hazard on x1_grad"}
    unwrapped = ex.check(pipeline(assign_backward_streams, insert_backward_syncs, sync_deallocations))
    assert not unwrapped.ok and all(p.startswith("reorder hazard") for p in unwrapped.problems)


def test_a_failed_pipeline_is_undone_also_with_the_fast_path_off(monkeypatch):
    # without FX's private fields (fastfx off), the transaction cannot revive erased nodes: it puts back a copy it made
    import streamnb.fastfx as fastfx
    from streamnb.examples import running_example
    from streamnb.graph import StreamRegistry, canonical, use_registry
    monkeypatch.setattr(fastfx, "FAST", False)
    gm = running_example()
    before = canonical(gm)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        with pytest.raises(Exception, match="mechanism"):
            run_stream_passes(gm, mechanism="nope")
        assert canonical(gm) == before and "streamnb_passes" not in gm.meta
        run_stream_passes(gm)                      # the retry runs every pass
    assert len(gm.meta["streamnb_passes"]) == 5
