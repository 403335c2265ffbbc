"""Issue 48, what tests/test_reliability.py left open: the one `graph.validate` also checks a `val` against an `aten`
packet's overloads and a `Tensor[]` result, refuses a `meta` dict two nodes share, and guards `sync_forward` and
`minimize_syncs`; a processed graph is recognised from the syncs in it (`graph.RECOGNISE`) when a copy dropped every
mark; a retry after a failure anywhere in the pipeline is a fresh run; a finished switch leaves in dynamo's object
table only what its compiled graphs read. The tests marked "Base:" fail on a7785f9; the others pin a choice."""
import copy
import warnings

import pytest
import torch
from torch.fx import GraphModule

from test_bad_input import base_graph, call, fresh_result, fw_metadata, node, snapshot
from test_reliability import ENTRY, FORMS, plain_graph, symint, tables
from streamnb.assign import assign_backward_streams
from streamnb.examples import cross_read
from streamnb.dealloc import sync_deallocations
from streamnb.graph import (PIPELINE_ORDER, AlreadyProcessedWarning, GraphBuilder, StreamnbError, StreamRegistry,
                            canonical, streams, use_registry)
from streamnb.minsync import minimize_syncs, run_passes_fewest_syncs
from streamnb.pipeline import run_stream_passes, sync_forward
from streamnb.streamops import count_syncs
from streamnb.syncs import insert_backward_syncs

aten = torch.ops.aten
MORE = {"sync_forward": sync_forward, "minimize_syncs": minimize_syncs,
        "run_passes_fewest_syncs": run_passes_fewest_syncs}
ALL = {**ENTRY, **MORE}


def retarget(target, val):
    def spoil(gm):
        c = node(gm, "c"); c.target = target; c.meta["val"] = val() if callable(val) else val
        return "c"
    return spoil


VALS = {
    "int val on the packet aten.relu": retarget(aten.relu, 3),
    "None val on the packet aten.mm": retarget(aten.mm, None),
    "SymInt val on the packet aten.relu": retarget(aten.relu, symint),
    "int val on aten.split.Tensor (a Tensor[])": retarget(aten.split.Tensor, 3),
    "a list of ints on aten.split.Tensor": retarget(aten.split.Tensor, [1, 2]),
    "object() val on aten.unbind.int": retarget(aten.unbind.int, object),
}


@pytest.mark.parametrize("func", list(ALL))
@pytest.mark.parametrize("form", list(VALS))
def test_a_non_tensor_val_on_a_packet_or_a_list_result_is_refused(form, func):
    "Base: a packet or a Tensor[] result was not checked: no error, the value taken for a host value."
    gm = plain_graph() if func == "assign_streams" else base_graph()
    name = VALS[form](gm)
    before = snapshot(gm)
    with pytest.raises(StreamnbError, match=rf"node {name}: .* but its meta\['val'\] is not a tensor"):
        call(ALL[func], gm)
    assert snapshot(gm) == before


@pytest.mark.parametrize("target, val", [(aten.add, 3), (aten.add, symint), (aten.sym_size, 4),
                                         (aten.split.Tensor, [torch.empty(2, 4, device="meta"), None])])
def test_what_an_op_may_make_is_still_accepted(target, val):
    "aten.add has host overloads (add.int): an int there may be a host value; a Tensor[] may hold None (not computed)."
    gm = base_graph()
    retarget(target, val)(gm)
    call(ENTRY["sanitize"], gm)
    call(ENTRY["simulate"], gm)


@pytest.mark.parametrize("func", list(MORE))
@pytest.mark.parametrize("form", list(FORMS))
def test_sync_forward_and_the_fewest_syncs_refuse_a_broken_graph_naming_the_node(form, func):
    "Base: sync_forward ran on any of them; minimize_syncs changed a graph with a cycle, a name twice, two outputs."
    gm = base_graph()
    name = FORMS[form](gm)
    before = snapshot(gm)
    with pytest.raises(StreamnbError, match=rf"node {name}\b"):
        call(MORE[func], gm)
    assert snapshot(gm) == before


@pytest.mark.parametrize("func", list(ALL))
def test_a_meta_dict_two_nodes_share_is_refused(func):
    "Base: accepted; assigning one node's stream moved the other (both modes)."
    gm = plain_graph() if func == "assign_streams" else base_graph()
    node(gm, "g").meta = node(gm, "c").meta
    before = snapshot(gm)
    with pytest.raises(StreamnbError, match=r"node g: its meta dict is node c's \(one object\)"):
        call(ALL[func], gm)
    assert snapshot(gm) == before


def without_our_meta(gm):
    "A copy of `gm`'s graph without the marks, nor any node's `meta['streamnb_pass']`: only what the passes inserted."
    g = copy.deepcopy(gm.graph)
    for n in g.nodes: n.meta.pop("streamnb_pass", None)
    return GraphModule(gm, g)


@pytest.mark.parametrize("upstream", [False, True])
@pytest.mark.parametrize("last", ["insert_backward_syncs", "sync_deallocations"])
def test_a_processed_graph_is_recognised_from_its_syncs(last, upstream):
    "Base: the copy has no mark left, so its syncs were inserted a second time (10 -> 14 syncs)."
    gm = base_graph()
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        assign_backward_streams(gm, upstream=upstream); insert_backward_syncs(gm, upstream=upstream)
        if last == "sync_deallocations": sync_deallocations(gm, upstream=upstream)
    again = without_our_meta(gm)
    assert "streamnb_passes" not in again.meta and not any("streamnb_pass" in n.meta for n in again.graph.nodes)
    before = canonical(again)
    with warnings.catch_warnings(record=True) as w, use_registry(StreamRegistry(start=200, current_stream=0)):
        warnings.simplefilter("always")
        insert_backward_syncs(again, upstream=upstream)
        if last == "sync_deallocations": sync_deallocations(again, upstream=upstream)
    assert canonical(again) == before, "syncs inserted a second time"
    assert any(issubclass(x.category, AlreadyProcessedWarning) and "wait" in str(x.message) for x in w)


def test_a_programs_own_sync_on_one_read_does_not_stop_the_pass():
    "Recognised only if every cross-stream read is synced as the pass syncs it: one read the program left is synced."
    gm = cross_read(synced_too=False)   # c (stream 2) ordered by the program's own pair; d (stream 3) not: the pass must add one
    with warnings.catch_warnings():
        warnings.simplefilter("error", AlreadyProcessedWarning)
        call(insert_backward_syncs, gm)
    assert count_syncs(gm) > 2


@pytest.mark.parametrize("upstream", [False, True])
@pytest.mark.parametrize("failing", PIPELINE_ORDER)
def test_a_retry_after_a_failure_after_any_pass_is_a_fresh_run(failing, upstream):
    "Each pass fails after its edits (an `after` step raises): the graph is put back; the retry is a fresh run's graph."
    def boom(_): raise RuntimeError("fails after " + failing)
    gm = base_graph()
    before = snapshot(gm)
    with pytest.raises(RuntimeError, match="fails after"):
        call(lambda g: run_stream_passes(g, upstream=upstream, fw_metadata=fw_metadata(), after={failing: boom}), gm)
    assert snapshot(gm) == before
    with warnings.catch_warnings():
        warnings.simplefilter("error", AlreadyProcessedWarning)
        call(lambda g: run_stream_passes(g, upstream=upstream, fw_metadata=fw_metadata()), gm)
    assert snapshot(gm) == fresh_result(upstream=upstream, fw_metadata=fw_metadata())


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_finished_switch_leaves_only_what_its_compiled_graphs_read(dynamic):
    """A block that ends normally keeps, in dynamo's object table, exactly the events and streams its compiled graphs
    name (their runtime looks them up by index, as with torch's own passes); a failed block keeps none
    (test_reliability). Here the CPU cannot run events: the call fails inside the block and is caught there."""
    from functorch.compile import aot_function
    from streamnb.compiling import use_streamnb_passes
    from streamnb.examples import two_stream_fn
    from streamnb.streamops import indices_in_use
    xs = (torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True))
    before = tables()
    with use_streamnb_passes(cpu_as="meta") as sw:
        try: aot_function(two_stream_fn, fw_compiler=lambda g, _: g, dynamic=dynamic)(*xs)
        except RuntimeError as e: assert "support events" in str(e)
    new = set(tables()[0]) - set(before[0])
    assert sw.graphs and new and new <= set().union(*(indices_in_use(g) for g in sw.graphs))
    assert set(before[0]) <= set(tables()[0])
