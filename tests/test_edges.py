"""The graph's edges: with `inputs_ready="made"` a graph input is ready on the stream that made it before the graph
(its node's stream annotation, else the caller's current stream), so a side stream that reads it without a wait races
(the sanitizer, the simulator); `explain` judges the program as written that way (PyTorch's CUDA notes' example);
`"everywhere"` (the default for now: the entry fence assumed) and a dict say otherwise."""
import warnings

import pytest
import torch

from streamnb.cpustreams import cpu_streams
from streamnb.explainer import explain
from streamnb.graph import GraphBuilder, StreamRegistry, StreamnbError, streams
from streamnb.sanitizer import sanitize
from streamnb.simulator import simulate

aten = torch.ops.aten
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def reg():
    return StreamRegistry(start=100, current_stream=0)


def side_reads(program_wait: bool = False):
    "A backward whose side stream 1 reads the tangent and a parameter, and returns what it made."
    b = GraphBuilder(inputs_ready="made")
    w = b.input("primals_1", tag="is_forward"); g = b.input("tangents_1")
    if program_wait: b.sync(streams.wait_stream.default, 1, 0)
    m = b.op(aten.mul.Tensor, g, w, stream=1, name="m")
    return b.output(b.op(aten.neg.default, m, stream=1, name="n"))


def input_races(gm, inputs_ready="made"):
    return sorted((e.nodes, e.tensor) for e in sanitize(gm, registry=reg(), inputs_ready=inputs_ready).errors
                  if e.kind == "race")


def test_a_side_stream_reading_an_input_races():
    assert input_races(side_reads()) == [(("m", "primals_1"), "primals_1"), (("m", "tangents_1"), "tangents_1")]
    msg = sanitize(side_reads(), registry=reg(), inputs_ready="made").errors[0].message
    assert "graph input" in msg and "s.wait_stream(torch.cuda.current_stream())" in msg
    assert input_races(side_reads(program_wait=True)) == []   # the program's own wait_stream at entry orders it
    assert input_races(side_reads(), inputs_ready="everywhere") == []   # an entry fence, if the caller says so
    assert [e.kind for e in sanitize(side_reads(), registry=reg()).errors] == ["race", "race", "unjoined_output"]  # default: "made"


def test_inputs_ready_says_otherwise():
    assert input_races(side_reads(), inputs_ready="everywhere") == []
    assert input_races(side_reads(), inputs_ready={"tangents_1": [None, 1]}) == [(("m", "primals_1"), "primals_1")]
    assert input_races(side_reads(), inputs_ready={"tangents_1": 1, "primals_1": "everywhere"}) == []
    with pytest.raises(StreamnbError, match="inputs: primals_1, tangents_1"):
        sanitize(side_reads(), registry=reg(), inputs_ready={"x": 1})
    with pytest.raises(TypeError, match="inputs_ready"):
        sanitize(side_reads(), registry=reg(), inputs_ready={"tangents_1": "1"})
    with pytest.raises(TypeError, match="inputs_ready"):
        sanitize(side_reads(), registry=reg(), inputs_ready="nowhere")


def test_an_annotated_input_is_ready_on_its_stream():
    "A saved activation keeps the forward node's annotation (the partitioner shares its meta): ready on that stream."
    b = GraphBuilder(inputs_ready="made")
    a = b.input("relu", stream=1)
    gm = b.output(b.op(aten.neg.default, a, stream=1), b.op(aten.sin.default, a, stream=0, name="s0"))
    assert [e.nodes for e in sanitize(gm, registry=reg(), inputs_ready="made").errors if e.kind == "race"] == [("s0", "relu")]


def test_the_simulator_marks_the_unordered_read_of_an_input():
    tl = simulate(side_reads(), registry=reg(), inputs_ready="made")
    assert sorted((r.consumer, r.producer) for r in tl.unordered_reads) == [("m", "primals_1"), ("m", "tangents_1")]
    assert simulate(side_reads(), registry=reg()).unordered_reads == tl.unordered_reads   # "made" is the default
    assert simulate(side_reads(), registry=reg(), inputs_ready="everywhere").unordered_reads == []   # a fence, if said
    assert simulate(side_reads(program_wait=True), registry=reg(), inputs_ready="made").unordered_reads == []
    assert tl.spans == simulate(side_reads(), registry=reg(), inputs_ready="everywhere").spans   # it moves no kernel




def docs_example(fixed: bool):
    "PyTorch's CUDA notes: a side stream reads a tensor the caller just made, with no wait_stream first."
    s = torch.cuda.Stream()
    def f(A, w):
        if fixed: s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            B = (A @ w).sum()
        torch.cuda.current_stream().wait_stream(s)
        return B
    return f


@pytest.mark.parametrize("fixed", [False, True])
def test_the_cuda_notes_example(fixed):
    with cpu_streams():
        ex = explain(docs_example(fixed), torch.randn(16, 16), torch.randn(16, 16, requires_grad=True))
    races = sorted(e.tensor for e in ex.written.errors if e.kind == "race")
    assert races == ([] if fixed else ["primals_1", "primals_2"])
    note = " ".join(ex.summary_text().split())   # (the notes are wrapped at 110 columns)
    if not fixed:
        assert "s.wait_stream(torch.cuda.current_stream())" in ex.written.errors[0].message
        assert "at its entry" in note and "fix the program with `s.wait_stream(torch.cuda.current_stream())`" in note
    else: assert "at its entry" not in note
    assert ex.modes["default"].matches_eager


def test_an_annotate_region_reading_an_input_is_named_as_the_compilers_gap():
    "`annotate` regions run on one stream in eager: the note does not tell the user to write a wait_stream."
    import torch.fx.traceback as fxt
    def f(x, w):
        with fxt.annotate({"stream": 1}):
            h = (x @ w).relu()
        return h.sum()
    ex = explain(f, torch.randn(8, 8), torch.randn(8, 8, requires_grad=True))
    assert {"primals_1", "primals_2"} <= {e.tensor for e in ex.written.errors if e.kind == "race"}
    note = " ".join(ex.summary_text().split())
    assert "at its entry" in note and "annotate" in note and "fix the program with" not in note
