"""Tests for streamnb.metadata: mutated_inp_stream_indices from the forward graph's outputs."""
from types import SimpleNamespace

import pytest
import torch
from torch.fx import GraphModule

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
    assert sorted((e.kind, e.tensor) for e in sanitize(with_wrapper()).errors) == [("race", "mul"), ("race", "primals_1")]
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
    assert grade.syncs == 1


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
