"""Tests for streamnb.metadata: mutated_inp_stream_indices from the forward graph's outputs."""
from types import SimpleNamespace

import pytest
import torch
from torch.fx import GraphModule

from streamnb.examples import mutate_join_mutate, mutate_then_event_join, mutate_then_join, old_value_after_join
from streamnb.course import WRAPPER_COST, with_wrapper, wrapper_exercise, wrapper_exercise_solution
from streamnb.graph import GraphBuilder, StreamAnnotationError, StreamnbError, aten
from streamnb.metadata import MissingOutputError, populate_fw_metadata_with_stream_indices


def fwd(streams=(1, None, 2), extra_const=False):
    b = GraphBuilder()
    x = b.input("primals_1", tag="is_forward")
    outs = [b.op(aten.mul.Tensor, x, x, stream=s, tag="is_forward") for s in streams]
    b.graph.output(tuple(outs) + ((3,) if extra_const else ()))
    b.gm.recompile()
    return b.gm


def indices(gm, n, upstream=False):
    meta = SimpleNamespace(num_mutated_inp_runtime_indices=n)
    populate_fw_metadata_with_stream_indices(gm, meta, upstream=upstream)
    return meta.mutated_inp_stream_indices


@pytest.mark.parametrize("upstream", [True, False])
def test_first_outputs_streams(upstream):
    gm = fwd((1, None, 2))
    assert indices(gm, 1, upstream) == [1]
    assert indices(gm, 2, upstream) == [1, None]
    assert indices(gm, 3, upstream) == [1, None, 2]


def test_out_of_range_and_non_node_outputs_are_none():
    gm = fwd((4,), extra_const=True)
    assert indices(gm, 4) == [4, None, None, None]


def test_no_mutated_inputs_empty_list_even_without_output():
    assert indices(GraphModule(torch.nn.Module(), torch.fx.Graph()), 0) == []


def test_no_output_node_is_a_clear_error():
    empty = GraphModule(torch.nn.Module(), torch.fx.Graph())
    with pytest.raises(MissingOutputError, match="no output node"):
        indices(empty, 2)
    assert issubclass(MissingOutputError, AssertionError) and issubclass(MissingOutputError, StreamnbError)


def test_bad_annotation_named():
    gm = fwd((1, 2))
    list(gm.graph.nodes)[2].meta["custom"] = {"stream": "x"}
    with pytest.raises(StreamAnnotationError, match="node mul_1"):
        indices(gm, 2)


def test_graph_unchanged_and_idempotent():
    gm = fwd((1, None, 2))
    before = [(n.name, n.args, dict(n.meta.get("custom") or {})) for n in gm.graph.nodes]
    assert indices(gm, 3) == indices(gm, 3)
    assert [(n.name, n.args, dict(n.meta.get("custom") or {})) for n in gm.graph.nodes] == before


def test_against_torch_oracle():
    oracle = pytest.importorskip("oracle")
    impl = oracle.load_impl("seed")
    for n in (0, 1, 3, 5):
        gm = fwd((1, None, 2), extra_const=True)
        ref = SimpleNamespace(num_mutated_inp_runtime_indices=n)
        impl.populate_fw_metadata_with_stream_indices(gm, ref)
        assert indices(gm, n, upstream=True) == ref.mutated_inp_stream_indices


# --- the chapter's pictures, the running example and the exercise (nbs/14_metadata.ipynb) ---

def test_wrapper_picture_blind_copy_races_told_copy_waits():
    from streamnb.sanitizer import sanitize
    from streamnb.simulator import simulate
    blind = simulate(with_wrapper(), cost=WRAPPER_COST)
    assert [(r.consumer, r.producer, round(r.start * 1e3, 6), round(r.producer_end * 1e3, 6))
            for r in blind.unordered_reads] == [("copy_", "mul", 1.0, 3.0)]
    # mul (stream 1) is also returned with nothing joining it to the caller's stream: the wrapper's wait joins it
    assert sorted((e.kind, e.tensor) for e in sanitize(with_wrapper()).errors) == [
        ("race", "mul"), ("race", "primals_1"), ("unjoined_output", "mul")]
    told_gm = wrapper_exercise_solution(with_wrapper())
    told = simulate(told_gm, cost=WRAPPER_COST)
    assert told.unordered_reads == []
    assert [(w.stream, round(w.start * 1e3, 6), round(w.end * 1e3, 6)) for w in told.waits if w.duration > 0] == [(0, 1.0, 3.0)]
    assert round(told.spans["copy_"][1] * 1e3, 6) == 3.0
    assert sanitize(told_gm).errors == []


def test_running_example_metadata_after_the_pipeline():
    from streamnb.examples import running_example
    from streamnb.graph import StreamRegistry, get_stream, use_registry
    from streamnb.pipeline import run_stream_passes
    meta = SimpleNamespace(num_mutated_inp_runtime_indices=0)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        gm = run_stream_passes(running_example(), fw_metadata=meta)
    assert meta.mutated_inp_stream_indices == []
    outs = gm.graph.find_nodes(op="output")[0].args[0]
    assert [get_stream(o) for o in outs] == [1, 2, 0]
    assert indices(gm, 3) == [1, 2, 0]


def test_exercise_wrapper_solution_is_ok():
    ex = wrapper_exercise()
    grade = ex.check(wrapper_exercise_solution(with_wrapper()))
    assert grade.ok, grade
    assert grade.syncs == 2   # the program's join of sin (in the start graph), and the wrapper's one wait, for mul
    assert ex.check(with_wrapper()).syncs == 1


def test_exercise_wrapper_wrong_answers_are_caught():
    from streamnb.exercises import insert
    from streamnb.graph import streams
    ex = wrapper_exercise()
    last = with_wrapper()                      # the notebook's wrong attempt: the last output's stream (2)
    insert(last, streams.wait_stream.default, 0, 2, before="copy_")
    grade = ex.check(last)
    assert not grade.ok
    assert any(p.startswith("race on mul: copy_ (stream 0) and mul (stream 1)") for p in grade.problems), grade
    nothing = ex.check(with_wrapper())         # no wait at all
    assert not nothing.ok and any(p.startswith("race on primals_1") for p in nothing.problems), nothing


# ---------------------------------------------------------------------------------------------------------------
# Issue 27: correction 19 (write-backs no barrier order can honour, refused from AOTAutograd's metadata in this pass)
# and correction 13's event joins (the write-back goes before the record the join waits for).
# ---------------------------------------------------------------------------------------------------------------

from streamnb.assign import UnorderableWriteBackError, assign_epilogue_copy_streams, check_write_backs  # noqa: E402
from streamnb.graph import StreamRegistry, streams, use_registry  # noqa: E402
from streamnb.pipeline import run_stream_passes  # noqa: E402

SEED_SILENT = pytest.param(True, marks=pytest.mark.xfail(strict=True, reason="the seed compiles it silently"),
                           id="upstream")


def mutation_meta(outside: bool, mutates=(True,)):
    "AOTAutograd's `ViewAndMutationMeta`, the fields read: which inputs mutate their data, which are written back outside."
    runtime = [i for i, m in enumerate(mutates) if m] if outside else []
    return SimpleNamespace(input_info=[SimpleNamespace(mutates_data=m) for m in mutates],
                           mutated_inp_runtime_indices=runtime, num_mutated_inp_runtime_indices=len(runtime))


def new_value_then(sync: str, device="meta", sync_tag="is_forward"):
    "Input 0's new value `add` on stream 1 (returned first: the wrapper writes it back), then `sync`, then `neg` on 0."
    b = GraphBuilder(device=device)
    x = b.input("primals_1", tag="is_forward")
    new = b.op(aten.add.Tensor, x, x, stream=1, tag="is_forward")
    if sync == "wait_stream": b.sync(streams.wait_stream.default, 0, 1, tag=sync_tag)   # the current stream joins
    elif sync == "wait_stream_side": b.sync(streams.wait_stream.default, 2, 1, tag=sync_tag)   # stream 2 joins
    elif sync == "record_event": b.sync(streams.record_event.default, 5, 1, tag=sync_tag)
    elif sync == "synchronize_device": b.sync(streams.synchronize_device.default, "cuda", 0, tag=sync_tag)
    elif sync == "wait_stream_other": b.sync(streams.wait_stream.default, 0, 2, tag=sync_tag)   # joins stream 2 only
    return b.output(new, b.op(aten.neg.default, new, stream=0, tag="is_forward"))


@pytest.mark.parametrize("upstream", [False, SEED_SILENT])
@pytest.mark.parametrize("sync", ["wait_stream_side", "record_event", "synchronize_device"])
def test_correction_19_out_of_graph_write_back_before_a_barrier_is_refused(sync, upstream):
    "A barrier that orders another stream, an event nobody in the graph waits for, or the host after the new value."
    with pytest.raises(UnorderableWriteBackError, match="Move the barrier after the compiled function call") as e:
        populate_fw_metadata_with_stream_indices(new_value_then(sync), mutation_meta(outside=True), upstream=upstream)
    assert e.value.args[0].startswith(f"node {sync.removesuffix('_side')}_default: input 0 is mutated")
    what = {"wait_stream_side": "stream 2's work", "record_event": "event 5", "synchronize_device": "the host"}[sync]
    assert f"orders {what}" in e.value.args[0] or f"waits for {what}" in e.value.args[0]


def test_correction_19_only_where_the_graph_and_metadata_decide_it():
    """No barrier of the value's stream, a join of the current stream (where the write-back runs, after it), a backward
    barrier, CPU values, no mutated data, or no metadata: no refusal."""
    cases = [(new_value_then("wait_stream_other"), mutation_meta(True)),
             (new_value_then("wait_stream"), mutation_meta(True)),   # the current stream joins: the write-back follows
             (new_value_then("wait_stream", sync_tag="is_backward"), mutation_meta(True)),
             (new_value_then("wait_stream", device="cpu"), mutation_meta(True)),
             (new_value_then("wait_stream"), mutation_meta(True, mutates=(False,))),
             (new_value_then("wait_stream"), SimpleNamespace(num_mutated_inp_runtime_indices=1))]
    for gm, meta in cases:
        populate_fw_metadata_with_stream_indices(gm, meta)
        assert meta.mutated_inp_stream_indices == ([1] if meta.num_mutated_inp_runtime_indices else [])


def test_correction_19_reads_a_wrapped_graph():
    "After the whole pipeline (the join wrapped in `control_deps`), the refusal names the wrapper and the sync in it."
    gm, meta = new_value_then("wait_stream_side"), mutation_meta(outside=True)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        with pytest.raises(UnorderableWriteBackError, match=r"node control_deps \(wait_stream_default\)"):
            run_stream_passes(gm, fw_metadata=meta, passes=("wrap_all_sync_nodes_with_control_deps",))


@pytest.mark.parametrize("upstream", [False, SEED_SILENT])
@pytest.mark.parametrize("make, what", [(mutate_join_mutate, "add, a version of the input"),
                                        (old_value_after_join, "neg still uses the input's old value")])
def test_correction_19_mutation_spanning_a_barrier_is_refused(make, what, upstream):
    gm = make()
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        with pytest.raises(UnorderableWriteBackError, match="spans a stream barrier") as e:
            run_stream_passes(gm, fw_metadata=mutation_meta(outside=False), upstream=upstream)
    assert what in str(e.value)


def test_correction_19_a_write_back_correction_13_moves_is_not_refused():
    "The join covers the moved copy: the pipeline with full metadata goes through."
    gm = mutate_then_join()
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm, fw_metadata=mutation_meta(outside=False))
    check_write_backs(gm, mutation_meta(outside=False))


@pytest.mark.parametrize("upstream", [False, pytest.param(True, marks=pytest.mark.xfail(strict=True,
                         reason="the seed leaves the copy at the end"))])
def test_correction_13_write_back_goes_before_the_record_an_event_join_waits_for(upstream):
    """Stream 0 joins stream 1 through event 5. The event holds stream 1's work as it was at the record: main's
    correction 13 moved the copy between the record and the wait, where the wait does not cover it."""
    gm = mutate_then_event_join()
    assign_epilogue_copy_streams(gm, upstream=upstream)
    names = [n.name for n in gm.graph.nodes if n.op == "call_function"]
    assert names == ["add", "copy_", "record_event_default", "wait_event_default", "neg"]
