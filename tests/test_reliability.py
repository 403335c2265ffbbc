"""Issue 48: every public entry point validates a graph as the passes do (`graph.validate`), and the other input forms
that slipped through: a non-tensor `val` on a tensor op, a `custom` dict two nodes share, a stale `users` entry, a
GraphModule handed to the trace writer, dynamo's object table after a failed capture or switch, a dynamic dimension,
torch's log in the CLI, a processed graph copied without its marks."""
import copy
import subprocess
import sys
import warnings

import pytest
import torch
from torch.fx import GraphModule

from test_bad_input import FUNCS, base_graph, call, fresh_result, fw_metadata, node, snapshot
from streamnb.assign import assign_backward_streams
from streamnb.choosing import assign_streams
from streamnb.dealloc import sync_deallocations
from streamnb.graph import (AlreadyProcessedWarning, GraphBuilder, StreamnbError, StreamRegistry, canonical, get_stream,
                            use_registry)
from streamnb.pipeline import run_stream_passes
from streamnb.syncs import insert_backward_syncs

aten = torch.ops.aten
ENTRY = {**FUNCS, "assign_streams": assign_streams}


def plain_graph():
    "base_graph without its syncs and streams: what assign_streams takes (x, t -> a, c, d, e; g accumulates d + e)."
    b = GraphBuilder()
    x, t = b.input("x", tag="is_forward"), b.input("tangents_1")
    a = b.op(aten.mul.Tensor, x, t, name="a")
    c = b.op(aten.add.Tensor, a, x, name="c")
    d = b.op(aten.relu.default, c, name="d")
    e = b.op(aten.neg.default, a, name="e")
    g = b.op(aten.add.Tensor, d, e, acc=True, name="g")
    return b.output(a, d, g)


def cycle(gm):
    a = node(gm, "a"); a.args = (node(gm, "c"), a.args[1])   # a reads c, which reads a
    return "a"


def dangling(gm):
    a = node(gm, "a"); a.args = (node(plain_graph(), "x"), a.args[1])   # a node of another graph
    return "a"


def use_before_definition(gm):
    node(gm, "a").prepend(node(gm, "c"))
    return "c"


def same_name(gm):
    node(gm, "d").name = "c"
    return "c"


def two_outputs(gm):
    gm.graph.output((node(gm, "a"),))
    return "output_1"


def stale_user(gm):
    node(gm, "c").users[node(plain_graph(), "d")] = None   # a user not in this graph
    return "c"


def val(v):
    def spoil(gm):
        node(gm, "c").meta["val"] = v() if callable(v) else v
        return "c"
    return spoil


def symint():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return ShapeEnv().create_unbacked_symint()


FORMS = {
    "cycle": cycle, "dangling argument": dangling, "use before definition": use_before_definition,
    "two nodes named alike": same_name, "two output nodes": two_outputs, "a user not in the graph": stale_user,
    "int val on aten.add": val(3), "None val on aten.add": val(None), "object() val on aten.add": val(object),
    "empty list val on aten.add": val([]), "SymInt val on aten.add": val(symint),
}


@pytest.mark.parametrize("func", list(ENTRY))
@pytest.mark.parametrize("form", list(FORMS))
def test_every_entry_point_refuses_a_broken_graph_naming_the_node(form, func):
    "Items 1, 2, 4. Base: assign_streams returns (or KeyError), the passes accept names twice, two outputs, bad vals."
    gm = plain_graph() if func == "assign_streams" else base_graph()
    name = FORMS[form](gm)
    before = snapshot(gm)
    with pytest.raises(StreamnbError, match=rf"node {name}\b"):
        call(ENTRY[func], gm)
    assert snapshot(gm) == before


def test_assign_streams_on_an_empty_graph_is_an_empty_answer():
    "Item 1. Base: AssignError 'the forward part of this graph has no compute node'."
    b = GraphBuilder()
    gm = b.output(b.input("x"), b.input("y"))
    before = canonical(gm)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        assert assign_streams(gm) is gm
    assert canonical(gm) == before and gm.meta["streamnb_assignment"]["streams"] == []


def test_a_sym_int_val_on_a_tensor_op_is_not_a_host_value():
    "Item 2: a SymInt val on aten.add read across streams was taken for a host value: no sync, an unordered read."
    b = GraphBuilder()
    x = b.input("x")
    a = b.op(aten.mul.Tensor, x, x, stream=1, name="a")
    a.meta["val"] = symint()
    b.op(aten.add.Tensor, a, x, stream=0, name="c")
    gm = b.output(node(b.gm, "c"))
    with pytest.raises(StreamnbError, match=r"node a: aten.mul.Tensor returns a Tensor but its meta\['val'\] is not a tensor"):
        call(insert_backward_syncs, gm)


def test_a_host_value_from_a_host_op_is_still_accepted():
    "sym_size makes a SymInt: a host value, not a broken graph (validate looks at the op's schema)."
    b = GraphBuilder()
    x = b.input("x")
    n = b.op(aten.sym_size.int, x, 0, name="n", val=4)
    gm = b.output(n)
    for f in ("insert_backward_syncs", "sanitize", "simulate", "run_stream_passes"):
        call(ENTRY[f], gm if f in ("sanitize", "simulate") else copy.deepcopy(gm))


@pytest.mark.parametrize("upstream", [False, True])
def test_a_custom_dict_shared_by_two_nodes_moves_only_the_assigned_one(upstream):
    "Item 3. Base: the gradient accumulation's stream moves the node that shares its dict, in both modes."
    gm = base_graph()
    g, c = node(gm, "g"), node(gm, "c")
    shared = g.meta["custom"] = c.meta["custom"] = {"stream": 0, "note": "kept"}
    call(lambda m: assign_backward_streams(m, upstream=upstream), gm)
    assert get_stream(c) == 0 and shared == {"stream": 0, "note": "kept"}
    assert g.meta["custom"] is not c.meta["custom"]


def test_pipeline_on_shared_custom_dicts_gives_separate_dicts():
    "Item 3 through the pipeline: no two nodes share a custom dict afterwards."
    gm = base_graph()
    node(gm, "g").meta["custom"] = node(gm, "d").meta["custom"]
    call(run_stream_passes, gm)
    customs = [n.meta["custom"] for n in gm.graph.nodes if isinstance(n.meta.get("custom"), dict)]
    assert len({id(c) for c in customs}) == len(customs)


@pytest.mark.parametrize("func", ["sanitize", "run_stream_passes", "simulate"])
def test_a_stale_user_is_a_streamnb_error_not_a_key_error(func):
    "Item 4. Base: KeyError 'd' from graph.py (sanitize, run_stream_passes)."
    gm = base_graph()
    stale_user(gm)
    with pytest.raises(StreamnbError, match="node c: its users hold d, a node not in this graph"):
        call(ENTRY[func], gm)


def test_write_chrome_trace_refuses_a_graph_module(tmp_path):
    "Item 5. Base: AttributeError: 'GraphModule' object has no attribute 'name'."
    from streamnb.simulator import simulate
    from streamnb.trace import to_chrome_trace, write_chrome_trace
    gm = base_graph()
    with pytest.raises(TypeError, match=r"timelines\[0\]: expected a Timeline, got GraphModule \(simulate\(gm\) first"):
        write_chrome_trace(tmp_path / "t.json", gm)
    assert not (tmp_path / "t.json").exists()
    with pytest.raises(TypeError, match="timeline: expected a Timeline"):
        to_chrome_trace(gm)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        write_chrome_trace(tmp_path / "t.json", simulate(gm))   # the Timeline: fine


@pytest.mark.parametrize("plot", ["plot_timeline", "plot_memory"])
def test_the_plots_refuse_a_graph_module(plot):
    "Item 5 (the plots, as the trace writer). Base: plot_memory raises AttributeError: ... no attribute 'name'."
    import streamnb.plot as P
    with pytest.raises(TypeError, match=r"timelines: argument 0 is a GraphModule, not a Timeline \(make one with simulate"):
        getattr(P, plot)(base_graph())


def tables():
    from torch._dynamo import graph_bytecode_inputs as B
    return (dict(B.index_to_bytecode_constructor), dict(B.index_to_external_object_weakref), list(B.keep_alive))


@pytest.mark.parametrize("frontend", ["dynamo", "auto"])
def test_a_failed_capture_leaves_dynamos_object_table_as_it_was(frontend):
    "Item 5. Base: a module called without its input leaves dynamo's table with one more entry."
    from streamnb.capturing import TraceError, capture
    before = tables()
    with pytest.raises(TraceError):
        capture(torch.nn.Linear(4, 4), frontend=frontend)   # no input
    assert tables() == before


class SideStream(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.lin = torch.nn.Linear(4, 4)
    def forward(self, x):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s): y = self.lin(x)
        torch.cuda.current_stream().wait_stream(s)
        return y.sum()


def test_capture_with_a_dynamic_dimension_names_the_cause():
    "Item 5. Base: 'BackendCompilerFailed: backend='backend' raised:.' and nothing of the cause."
    from streamnb.capturing import CaptureError, capture
    x = torch.randn(5, 4, requires_grad=True)
    torch._dynamo.mark_dynamic(x, 0)
    before = tables()
    with pytest.raises(CaptureError, match="the program has a dynamic dimension"):
        capture(SideStream(), x, frontend="dynamo")
    assert tables() == before


def test_cli_on_an_input_of_the_wrong_shape_says_one_line(tmp_path):
    "Item 5. Base: torch's fake-tensor log (dozens of `E... fake_tensor.py` lines) before streamnb's own."
    src = tmp_path / "m.py"
    src.write_text("import torch\ndef wrong_shape(): return torch.nn.Linear(4, 4), (torch.randn(2, 3, requires_grad=True),)\n")
    code = ("import sys; from streamnb.cli import main; "
            f"sys.exit(main(['explain', '{src}:wrong_shape', '--out', '{tmp_path / 'o'}', '--quiet']))")
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamnb: error: ") and "reduction dim" in lines[0], r.stderr[-3000:]


def test_a_failing_switch_block_leaves_dynamos_object_table_as_it_was():
    """Item 6. Base: use_streamnb_passes with aot_function(dynamic=True) leaves the table grown (the events and streams
    the passes registered) after a block that failed once the passes had run (here: in the forward's compiler)."""
    from functorch.compile import aot_function
    from streamnb.compiling import use_streamnb_passes
    from streamnb.examples import two_stream_fn
    def compiler_fails(gm, _): raise RuntimeError("the compiler fails")
    xs = (torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))
    before = tables()
    with pytest.raises(Exception, match="the compiler fails"):
        with use_streamnb_passes(cpu_as="meta") as sw:
            aot_function(two_stream_fn, fw_compiler=compiler_fails, dynamic=True)(*xs)
    assert sw.graphs, "the passes ran before the failure"
    assert tables() == before


@pytest.mark.parametrize("copy_graph", ["deepcopy of the graph", "GraphModule of a graph copy"])
@pytest.mark.parametrize("last", ["insert_backward_syncs", "sync_deallocations"])
def test_a_processed_graph_copied_without_its_marks_is_not_processed_twice(copy_graph, last):
    "Item 6. Base: the copy has no marks, so its syncs are inserted a second time."
    gm = base_graph()
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        assign_backward_streams(gm); insert_backward_syncs(gm)
        if last == "sync_deallocations": sync_deallocations(gm)
    g = copy.deepcopy(gm.graph)
    again = GraphModule(torch.nn.Module(), g) if copy_graph == "GraphModule of a graph copy" else GraphModule(gm, g)
    assert "streamnb_passes" not in again.meta and not hasattr(again.graph, "_streamnb_passes")
    before = canonical(again)
    with warnings.catch_warnings(record=True) as w, use_registry(StreamRegistry(start=200, current_stream=0)):
        warnings.simplefilter("always")
        insert_backward_syncs(again)
        if last == "sync_deallocations": sync_deallocations(again)
    assert canonical(again) == before, "syncs inserted a second time"
    assert any(issubclass(x.category, AlreadyProcessedWarning) for x in w)


def test_a_pipeline_that_failed_on_a_non_tensor_val_then_fixed_gives_a_fresh_runs_graph():
    "Item 6: refused before any change; after the fix, exactly a fresh run's graph (no marks or syncs left over)."
    gm = base_graph()
    d = node(gm, "d")
    good = d.meta["val"]
    before = snapshot(gm)
    d.meta["val"] = 7
    with pytest.raises(StreamnbError, match="node d: "):
        call(lambda g: run_stream_passes(g, fw_metadata=fw_metadata()), gm)
    d.meta["val"] = good
    assert snapshot(gm) == before
    with warnings.catch_warnings():
        warnings.simplefilter("error", AlreadyProcessedWarning)
        call(lambda g: run_stream_passes(g, fw_metadata=fw_metadata()), gm)
    assert snapshot(gm) == fresh_result(fw_metadata=fw_metadata())


def test_every_graph_entry_point_runs_the_one_validate():
    "The entry points share graph.validate: patching it to refuse is seen by each of them."
    from unittest import mock
    import streamnb.graph as G
    def refuse(gm, need_val=()): raise StreamnbError("node x: refused by the one validate")
    for name, fn in ENTRY.items():
        gm = plain_graph() if name == "assign_streams" else base_graph()
        mods = [m for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("streamnb")
                and getattr(m, "validate", None) is G.validate]
        patches = [mock.patch.object(m, "validate", refuse) for m in mods]
        for p in patches: p.start()
        try:
            with pytest.raises(StreamnbError, match="refused by the one validate"):
                call(fn, gm)
        finally:
            for p in patches: p.stop()
