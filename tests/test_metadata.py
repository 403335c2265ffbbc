"""Tests for streamnb.metadata: mutated_inp_stream_indices from the forward graph's outputs."""
from types import SimpleNamespace

import pytest
import torch
from torch.fx import GraphModule

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
