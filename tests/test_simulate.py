"""Tests of streamnb.simulator: exact hand-computed timelines, and properties over generated multi-stream graphs."""
import operator

import pytest
import torch
from hypothesis import given, settings, strategies as st

from streamnb.examples import big_and_small_branches, dealloc_graph, three_way
from streamnb.graph import GraphBuilder, StreamnbError, StreamRegistry, streams, use_registry
from streamnb.simulator import Lifetime, simulate

aten = torch.ops.aten
REC, WAIT = streams.record_event.default, streams.wait_event.default


def chain(costs, stream=1):
    b = GraphBuilder()
    v = b.input("x")
    for i, _ in enumerate(costs):
        v = b.op(aten.neg.default, v, stream=stream, name=f"k{i}")
    return b.output(v)


def test_single_stream_makespan_is_sum_of_costs():
    costs = [1.5, 2.0, 0.25, 4.0]
    tl = simulate(chain(costs), cost=lambda n: costs[int(n.name[1:])])
    assert tl.makespan == sum(costs)
    assert tl.busy == {1: sum(costs)}
    assert [tl.spans[f"k{i}"][1] for i in range(4)] == [0.0, 1.5, 3.5, 3.75]


def test_independent_streams_give_the_maximum():
    b = GraphBuilder()
    x = b.input("x")
    outs = [b.op(aten.neg.default, x, stream=s, name=f"n{s}") for s in (1, 2, 3)]
    gm = b.output(*outs)
    tl = simulate(gm, cost={"n1": 2.0, "n2": 7.0, "n3": 3.0})
    assert tl.makespan == 7.0
    assert tl.streams == [1, 2, 3]
    assert all(start == 0.0 for _, start, _ in tl.spans.values())


def test_none_and_current_indices_are_one_stream():
    reg = StreamRegistry(start=10)
    cur = reg.get_current_stream("cuda")
    b = GraphBuilder()
    x = b.input("x")
    a = b.op(aten.neg.default, x, name="a")               # unannotated
    c = b.op(aten.neg.default, a, stream=cur, name="c")   # a current-stream index
    gm = b.output(c)
    tl = simulate(gm, cost=lambda n: 1.0, registry=reg)
    assert tl.spans == {"a": (cur, 0.0, 1.0), "c": (cur, 1.0, 2.0)}
    assert tl.unordered_reads == [] and tl.makespan == 2.0


def cross(wait: bool, consumer_stream=0):
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.mul.Tensor, x, x, stream=1, name="p")
    b.sync(REC, 7, 1)
    if wait:
        b.sync(WAIT, 7, consumer_stream)
    c = b.op(aten.add.Tensor, p, x, stream=consumer_stream, name="c")
    return b.output(c)


def test_wait_orders_the_consumer_and_missing_wait_is_a_race():
    cost = {"p": 3.0, "c": 1.0}
    safe, racy = simulate(cross(True), cost=cost), simulate(cross(False), cost=cost)
    assert safe.spans["c"] == (0, 3.0, 4.0) and safe.makespan == 4.0
    assert [(w.stream, w.start, w.end) for w in safe.waits] == [(0, 0.0, 3.0)]
    assert safe.unordered_reads == []
    assert racy.spans["c"] == (0, 0.0, 1.0) and racy.makespan == 3.0
    (r,) = racy.unordered_reads
    assert (r.consumer, r.producer, r.consumer_stream, r.producer_stream, r.overlaps) == ("c", "p", 0, 1, True)


def test_transitive_ordering_through_an_intermediate_stream():
    # p on 1 -> record e3 -> wait on 2 -> record e4 on 2 (no kernel on 2 between) -> wait on 0 -> c reads p
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.neg.default, x, stream=1, name="p")
    b.sync(REC, 3, 1); b.sync(WAIT, 3, 2); b.sync(REC, 4, 2); b.sync(WAIT, 4, 0)
    c = b.op(aten.neg.default, p, stream=0, name="c")
    tl = simulate(b.output(c), cost={"p": 5.0, "c": 1.0})
    assert tl.spans["c"] == (0, 5.0, 6.0) and tl.unordered_reads == []


def test_wait_before_the_record_is_not_an_ordering():
    # the wait is issued before the record: CUDA waits on the event's previous state (never recorded: no-op)
    b = GraphBuilder()
    x = b.input("x")
    b.sync(WAIT, 3, 0)
    p = b.op(aten.neg.default, x, stream=1, name="p")
    b.sync(REC, 3, 1)
    c = b.op(aten.neg.default, p, stream=0, name="c")
    tl = simulate(b.output(c), cost={"p": 2.0, "c": 1.0})
    assert tl.spans["c"] == (0, 0.0, 1.0)
    assert [r.consumer for r in tl.unordered_reads] == ["c"]
    assert "not recorded before this point" in tl.waits[0].on


def test_host_syncs_block_issue():
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.neg.default, x, stream=1, name="p")
    b.sync(REC, 4, 1)
    q = b.op(aten.neg.default, x, stream=2, name="q")
    b.sync(streams.synchronize_event.default, 4)
    r = b.op(aten.add.Tensor, p, q, stream=3, name="r")
    b.sync(streams.synchronize_device.default, "cuda", 0)
    gm = b.output(r)
    tl = simulate(gm, cost={"p": 2.0, "q": 6.0, "r": 1.0})
    assert tl.spans["r"] == (3, 2.0, 3.0)      # after p (host waited for event 4), not after q
    assert [r.producer for r in tl.unordered_reads] == ["q"]
    assert [(w.op, w.stream, w.start, w.end) for w in tl.waits] == [
        ("synchronize_event", None, 0.0, 2.0), ("synchronize_device", None, 2.0, 6.0)]
    assert tl.host_time == 6.0 and tl.makespan == 6.0


def test_launch_overhead_makes_the_host_the_bottleneck():
    costs = [0.1] * 5
    tl = simulate(chain(costs), cost=lambda n: 0.1, launch_overhead=1.0)
    assert tl.spans["k4"] == (1, 5.0, 5.1)
    assert tl.makespan == pytest.approx(5.1)


def test_wait_stream():
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.neg.default, x, stream=1, name="p")
    b.sync(streams.wait_stream.default, 0, 1)
    c = b.op(aten.neg.default, p, stream=0, name="c")
    tl = simulate(b.output(c), cost={"p": 2.0, "c": 1.0})
    assert tl.spans["c"] == (0, 2.0, 3.0) and tl.unordered_reads == []
    assert [(f.src_stream, f.dst_stream, f.src_time) for f in tl.flows] == [(1, 0, 2.0)]


@pytest.mark.parametrize("remedy,free,unsafe,u_start,peak", [
    (None, 1.0, [("t", "r")], 1.0, 192),
    ("record_stream", 5.0, [], 1.0, 256),
    ("sync_dealloc", 5.0, [], 5.0, 192),
])
def test_deallocation(remedy, free, unsafe, u_start, peak):
    tl = simulate(dealloc_graph(remedy, tail=True), cost={"t": 1.0, "r": 4.0, "u": 2.0})
    assert tl.lifetimes["t"] == Lifetime(0, 64, 0.0, free)
    assert [(f.tensor, f.reader) for f in tl.unsafe_frees] == unsafe
    assert tl.spans["u"][1] == u_start
    assert tl.peak_memory == peak
    assert tl.lifetimes["x"].free is None and tl.lifetimes["r"].free is None   # inputs and outputs stay


def test_views_and_getitems_alias_and_take_no_time():
    b = GraphBuilder()
    x = b.input("x")
    m = b.op(aten.mul.Tensor, x, x, stream=1, name="m")
    v = b.op(aten.view.default, m, [16], stream=1, name="v")
    s = b.op(aten.max.dim, v, 0, stream=1, name="s")       # (values, indices): one kernel, one block
    g = b.op(operator.getitem, s, 0, name="g", val=s.meta["val"][0])
    n = b.op(aten.neg.default, g, stream=1, name="n")
    tl = simulate(b.output(n), cost=lambda node: 1.0)
    assert set(tl.spans) == {"m", "s", "n"}       # view and getitem are not kernels
    assert set(tl.lifetimes) == {"x", "m", "s", "n"}
    assert tl.lifetimes["m"].free == 2.0          # the view of m is read by split (ends at 2)
    assert tl.lifetimes["s"].free == 3.0          # the getitem of s is read by n (ends at 3)


def test_bad_cost_is_refused():
    with pytest.raises(StreamnbError, match="node k1: not in the cost table"):
        simulate(chain([1, 1]), cost={"k0": 1.0})


# ---- properties over generated graphs -------------------------------------------------------------------------

@st.composite
def graphs(draw, host_syncs=False):
    "A random graph: kernels on streams 0..2 reading earlier values, with record/wait pairs and (optionally) host syncs."
    b = GraphBuilder()
    values = [b.input("x")]
    cost, ops = {}, []
    recorded = []
    n = draw(st.integers(1, 25))
    for i in range(n):
        kind = draw(st.sampled_from(["k", "k", "k", "rec", "wait"] + (["hs"] if host_syncs else [])))
        s = draw(st.integers(0, 2))
        if kind == "k":
            a = draw(st.sampled_from(values))
            v = b.op(aten.neg.default, a, stream=s, name=f"k{i}")
            cost[v.name] = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))
            values.append(v)
            ops.append(("k", v.name, s))
        elif kind == "rec":
            b.sync(REC, 100 + i, s); recorded.append(100 + i); ops.append(("rec", 100 + i, s))
        elif kind == "wait" and recorded:
            e = draw(st.sampled_from(recorded))
            b.sync(WAIT, e, s); ops.append(("wait", e, s))
        elif kind == "hs":
            b.sync(streams.synchronize_stream.default, s)
    return b.output(values[-1]), cost, ops


def dag_bound(gm, cost):
    """Longest chain over the DAG of stream order (kernels and stream ops, per stream) and record->wait edges,
    computed independently of the simulator as an explicit graph."""
    items, edges, last_on, last_rec, reads = [], {}, {}, {}, []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if n.target is REC or n.target is WAIT:
            e, s = n.args
        elif n.target in (aten.neg.default,):
            s = n.meta["custom"]["stream"]
            reads += [(a.name, n.name) for a in n.all_input_nodes if a.op != "placeholder"]
        else:
            continue
        i = len(items); items.append(n.name); edges[i] = []
        if s in last_on: edges[i].append(last_on[s])
        last_on[s] = i
        if n.target is REC: last_rec[e] = i
        if n.target is WAIT and e in last_rec: edges[i].append(last_rec[e])
    finish = []
    for i, name in enumerate(items):
        finish.append(max((finish[j] for j in edges[i]), default=0.0) + cost.get(name, 0.0))
    index = {name: i for i, name in enumerate(items)}

    def reaches(src, dst):
        todo, seen = [index[dst]], set()
        while todo:
            j = todo.pop()
            if j == index[src]: return True
            if j in seen: continue
            seen.add(j); todo.extend(edges[j])
        return False
    return max(finish, default=0.0), {(p, c) for p, c in reads if not reaches(p, c)}


@settings(max_examples=150, deadline=None)
@given(graphs())
def test_makespan_is_the_dag_longest_chain_without_host_syncs(g):
    gm, cost, _ = g
    tl = simulate(gm, cost=cost)
    bound, unordered = dag_bound(gm, cost)
    assert tl.makespan == pytest.approx(bound)
    assert tl.makespan >= max(tl.busy.values(), default=0.0)
    assert {(r.producer, r.consumer) for r in tl.unordered_reads} == unordered
    for name, (s, start, end) in tl.spans.items():
        assert end - start == cost[name]


@settings(max_examples=150, deadline=None)
@given(graphs(host_syncs=True))
def test_critical_path_is_never_beaten(g):
    gm, cost, _ = g
    tl = simulate(gm, cost=cost)
    bound, unordered = dag_bound(gm, cost)
    assert tl.makespan >= bound - 1e-9
    assert tl.makespan >= max(tl.busy.values(), default=0.0)
    for busy_s, total in tl.busy.items():
        assert total == pytest.approx(sum(cost[k] for k, (s, _, _) in tl.spans.items() if s == busy_s))
    # host syncs can only add orderings: every unordered read is also unordered in the DAG
    assert {(r.producer, r.consumer) for r in tl.unordered_reads} <= unordered
    # an ordered read never starts before its producer ends
    racy = {(r.producer, r.consumer) for r in tl.unordered_reads}
    for n in gm.graph.nodes:
        if n.name in tl.spans:
            for a in n.all_input_nodes:
                if a.name in tl.spans and (a.name, n.name) not in racy:
                    assert tl.spans[n.name][1] >= tl.spans[a.name][2]
    # memory: allocated bytes never negative; the curve ends at inputs + live outputs
    assert all(b >= 0 for _, b in tl.memory)
    assert tl.peak_memory == max(b for _, b in tl.memory)
    live = sum(lt.nbytes for lt in tl.lifetimes.values() if lt.free is None)
    assert tl.memory[-1][1] == live


# ---- the project's passes, judged by the simulator ------------------------------------------------------------

def test_seed_defects_show_up_and_the_corrected_passes_are_clean():
    """Seed defect 1 (only the first cross-stream consumer waits) is an unordered read; defect 2 (sync_dealloc only
    for the last user's stream) is an unsafe free. The corrected passes leave neither."""
    from streamnb.control_deps import wrap_all_sync_nodes_with_control_deps
    from streamnb.dealloc import sync_deallocations
    from streamnb.syncs import insert_backward_syncs

    cost = {"p": 3.0, "c0": 1.0, "c2": 1.0}
    found = {}
    for upstream in (True, False):
        gm = three_way()
        reg = StreamRegistry(start=100, current_stream=0)
        with use_registry(reg):
            insert_backward_syncs(gm, upstream=upstream)
            sync_deallocations(gm, upstream=upstream)
            wrap_all_sync_nodes_with_control_deps(gm, upstream=upstream)
        tl = simulate(gm, cost=cost, registry=reg)
        found[upstream] = ([(r.consumer, r.producer) for r in tl.unordered_reads],
                           [(u.tensor, u.reader) for u in tl.unsafe_frees])
        assert set(tl.spans) == {"p", "c0", "c2"}
    assert found[True] == ([("c2", "p")], [("p", "c0")])
    assert found[False] == ([], [])


# ---- contention: kernels that overlap share the device (issue 13 item 1) ------------------------------------

from streamnb.cost import DEVICE_SPECS, get_roofline_estimate  # noqa: E402
from streamnb.contention import Demand, fair_level, kernel_demand, occupancy  # noqa: E402
from streamnb.simulator import us  # noqa: E402


def pair(cost_a, cost_b, same_stream=False, shapes=((4, 4), (4, 4)), ops=(aten.neg.default, aten.neg.default),
         dtype=None):
    b = GraphBuilder()
    outs = []
    for name, s, shape, op in zip("ab", (1, 1 if same_stream else 2), shapes, ops):
        x = b.input(f"x_{name}", shape=shape, dtype=dtype)
        outs.append(b.op(op, *([x, x] if op is aten.mm.default else [x]), stream=s, name=name))
    return b.output(*outs), ({"a": cost_a, "b": cost_b} if cost_a is not None else None)


def test_two_bandwidth_bound_kernels_on_two_streams_take_as_long_as_on_one():
    # by hand: memory demand 1 each -> load 2, fair level 1/2, each runs at rate 1/2: 1 ms of work ends at 2 ms,
    # exactly the single-stream makespan (1 + 1 ms)
    demands = {"a": Demand(0.0, 1.0), "b": Demand(0.0, 1.0)}
    two, cost = pair(1.0, 1.0)
    one, _ = pair(1.0, 1.0, same_stream=True)
    tl = simulate(two, cost=cost, contention=demands)
    assert tl.spans == {"a": (1, 0.0, 2.0), "b": (2, 0.0, 2.0)}
    assert tl.makespan == simulate(one, cost=cost, contention=demands).makespan == simulate(one, cost=cost).makespan == 2.0
    assert simulate(two, cost=cost).makespan == 1.0 and tl.contended and tl.busy == {1: 2.0, 2: 2.0}
    # from the roofline: neg of 4M float32 moves 2 x 16 MiB; alone it takes T = 32 MiB / 3350 GB/s and its memory
    # demand is T / T = 1 (occupancy 4096 blocks / 132 SMs -> 1): the same 2 T on two streams as on one
    two, _ = pair(None, None, shapes=((1 << 22,), (1 << 22,)))
    one, _ = pair(None, None, same_stream=True, shapes=((1 << 22,), (1 << 22,)))
    t = 2 * (1 << 22) * 4 / (DEVICE_SPECS["H100"].hbm_gbps * 1e9) * 1e3
    assert simulate(two).makespan == pytest.approx(t, rel=1e-12)
    assert simulate(two, contention=True).makespan == pytest.approx(2 * t, rel=1e-12)
    assert simulate(one, contention=True).makespan == pytest.approx(2 * t, rel=1e-12)


def test_two_small_latency_bound_kernels_overlap_fully():
    # by hand: demands 0.01 each -> loads 0.02 <= 1, rates 1: both end at their cost, as with free overlap
    two, cost = pair(us(5), us(5))
    tl = simulate(two, cost=cost, contention={"a": Demand(0.01, 0.01), "b": Demand(0.01, 0.01)})
    assert tl.spans == simulate(two, cost=cost).spans == {"a": (1, 0.0, us(5)), "b": (2, 0.0, us(5))}
    # from the roofline: neg of 1024 floats fills 1 block = 1/132 of the SMs; measured at 5 us (latency-bound) its
    # memory demand is 8 KiB / 3350 GB/s / 5 us ~ 5e-4; even at its roofline cost it asks for at most 1/132
    two, _ = pair(None, None, shapes=((1024,), (1024,)))
    node = next(n for n in two.graph.nodes if n.name == "a")
    assert occupancy(node) == 1 / 132
    assert kernel_demand(node, get_roofline_estimate(node)) == Demand(0.0, 1 / 132)
    for c in ({"a": us(5), "b": us(5)}, None):
        assert simulate(two, cost=c, contention=True).spans == simulate(two, cost=c).spans


def test_a_mixed_pair_lands_in_between():
    # by hand: a compute-bound (compute 1, memory 0.5), b bandwidth-bound (memory 1), 1 ms each.
    # compute load 1: no shortage. memory load 1.5: fair level 0.5 -> a gets its 0.5 (rate 1), b 0.5 (rate 0.5).
    # a ends at 1; b has done 0.5, then runs alone: ends at 1.5. free overlap 1, one stream 2.
    two, cost = pair(1.0, 1.0)
    tl = simulate(two, cost=cost, contention={"a": Demand(1.0, 0.5), "b": Demand(0.0, 1.0)})
    assert tl.spans == {"a": (1, 0.0, 1.0), "b": (2, 0.0, 1.5)}
    # from the roofline on an H100: a = mm(x, x), x 2048x2048 bf16 (2 * 2048^3 FLOPs at 75% of 989.4 TFLOP/s: C;
    # x read once and the output written, 2 * 2048^2 * 2 bytes at 3350 GB/s: T_a; compute demand 1, memory demand
    # m = T_a / C ~ 0.216; occupancy 4096 blocks / 132 SMs -> 1), b = neg of 2^25 bf16
    # (2 * 2^25 * 2 bytes: T_b, memory demand 1). Memory load 1 + m > 1: level 1 - m (since 2m < 1): a runs at 1,
    # b at 1 - m. At C, b has done (1 - m) C < T_b; it ends at C + T_b - (1 - m) C = T_b + m C.
    spec = DEVICE_SPECS["H100"]
    c = 2 * 2048 ** 3 / (spec.bf16_tflops * 1e12 * 0.75) * 1e3
    ta = 2 * 2048 ** 2 * 2 / (spec.hbm_gbps * 1e9) * 1e3
    tb = 2 * (1 << 25) * 2 / (spec.hbm_gbps * 1e9) * 1e3
    m = ta / c
    assert 2 * m < 1 and (1 - m) * c < tb
    two, _ = pair(None, None, shapes=((2048, 2048), (1 << 25,)), ops=(aten.mm.default, aten.neg.default),
                  dtype=torch.bfloat16)
    free, cont = simulate(two), simulate(two, contention=True)
    assert free.spans["a"][2] == pytest.approx(c, rel=1e-12) and free.makespan == pytest.approx(tb, rel=1e-12)
    assert cont.spans["a"][2] == pytest.approx(c, rel=1e-12)
    assert cont.spans["b"][2] == pytest.approx(tb + m * c, rel=1e-12)
    assert free.makespan < cont.makespan < c + tb   # between free overlap and one stream


def test_fair_level_and_bad_demands():
    assert fair_level([0.2, 0.3]) == float("inf")
    assert fair_level([0.5, 1.0]) == 0.5
    assert fair_level([1.0, 0.1, 1.0]) == pytest.approx(0.45)
    two, cost = pair(1.0, 1.0)
    with pytest.raises(StreamnbError, match="node b: not in the demand table"):
        simulate(two, cost=cost, contention={"a": Demand()})
    with pytest.raises(StreamnbError, match=r"node a: demand \(0, 2\)"):
        simulate(two, cost=cost, contention=lambda n: (0, 2))
    with pytest.raises(TypeError, match="contention: expected"):
        simulate(two, cost=cost, contention="yes")


@settings(max_examples=100, deadline=None)
@given(graphs(host_syncs=True), st.data())
def test_contention_never_speeds_up_and_respects_capacity(g, data):
    gm, cost, _ = g
    free = simulate(gm, cost=cost)
    # demands that fit (a total of at most 1 per resource) change nothing, exactly
    kernels = sorted(free.spans)
    small = {k: Demand(1 / (len(kernels) + 1), 0.5 / (len(kernels) + 1)) for k in kernels}
    same = simulate(gm, cost=cost, contention=small)
    assert (same.spans, same.waits, same.flows, same.memory, same.makespan, same.unsafe_frees) == \
           (free.spans, free.waits, free.flows, free.memory, free.makespan, free.unsafe_frees)
    # random demands: nothing gets earlier, no kernel is faster than alone, each stream still runs one at a time,
    # and no resource does more than the device can: sum(demand x cost) <= makespan
    fr = st.sampled_from([0.0, 0.25, 0.5, 1.0])
    demand = {k: Demand(data.draw(fr), data.draw(fr)) for k in kernels}
    tl = simulate(gm, cost=cost, contention=demand)
    assert tl.makespan >= free.makespan - 1e-9
    assert [(r.consumer, r.producer) for r in tl.unordered_reads] == [(r.consumer, r.producer) for r in free.unordered_reads]
    for k, (s, a, b) in tl.spans.items():
        assert a >= free.spans[k][1] - 1e-9 and b - a >= cost[k] - 1e-9
    for s in tl.streams:
        on = sorted((a, b) for (t, a, b) in tl.spans.values() if t == s)
        assert all(b1 <= a2 + 1e-9 for (_, b1), (a2, _) in zip(on, on[1:]))
    for r in (0, 1):
        assert sum(demand[k][r] * cost[k] for k in kernels) <= tl.makespan + 1e-9


# ---- the chapter's pictures show what its prose says (nbs/04a_simulate.ipynb) ----------------------------------

def test_chapter_pictures_support_the_prose():
    # "on one stream the kernels run back to back for 7 us; on two streams both start at 0, makespan 5 us"
    b = GraphBuilder(); x = b.input("x")
    a3 = b.op(aten.neg.default, b.op(aten.add.Tensor, b.op(aten.mul.Tensor, x, x, stream=1), x, stream=1), stream=1)
    one = simulate(b.output(a3), cost={"mul": us(1), "add": us(2), "neg": us(4)})
    spans = sorted(one.spans.values(), key=lambda v: v[1])
    assert all(e == s2 for (_, _, e), (_, s2, _) in zip(spans, spans[1:])) and one.makespan_us == pytest.approx(7)
    b = GraphBuilder(); x = b.input("x")
    p, q = b.op(aten.mul.Tensor, x, x, stream=1), b.op(aten.add.Tensor, x, x, stream=2)
    two = simulate(b.output(p, b.op(aten.neg.default, q, stream=2)), cost={"mul": us(5), "add": us(1), "neg": us(1)})
    assert two.spans["mul"][1] == two.spans["add"][1] == 0.0 and two.makespan_us == pytest.approx(5)
    # "without the sync add starts at 0 while mul runs until 3 us (red outline); with it stream 0 waits 0..3 us,
    # released by the event, and add runs from 3 to 4 us"
    cost = {"p": us(3), "c": us(1)}
    racy, safe = simulate(cross(False), cost=cost), simulate(cross(True), cost=cost)
    (r,) = racy.unordered_reads
    assert r.consumer == "c" and r.overlaps and racy.spans["c"][1] == 0.0 and racy.spans["p"][2] == pytest.approx(us(3))
    (w,) = safe.waits
    assert (w.stream, w.start, w.end) == (0, 0.0, pytest.approx(us(3))) and safe.unordered_reads == []
    assert [(f.src_time, f.dst_time) for f in safe.flows] == [(w.end, w.end)]
    assert safe.spans["c"][1:] == (pytest.approx(us(3)), pytest.approx(us(4)))
    # "no remedy: the block goes back at 1 us while neg reads it until 5 us; record_stream defers the free to 5 us;
    # sync_dealloc makes stream 0 wait until neg is done"
    cost = {"t": us(1), "r": us(4), "u": us(2)}
    plain, rs, sd = (simulate(dealloc_graph(m, tail=True), cost=cost) for m in (None, "record_stream", "sync_dealloc"))
    (u,) = plain.unsafe_frees
    assert (u.freed_at, u.read_end) == (pytest.approx(us(1)), pytest.approx(us(5))) and u.freed_at < u.read_end
    assert rs.lifetimes["t"].free == pytest.approx(us(5)) and rs.unsafe_frees == []
    assert [s.end for s in rs.syncs if s.op == "record_stream"] == [pytest.approx(us(5))]
    (dw,) = [w for w in sd.waits if w.op == "sync_dealloc"]
    assert (dw.stream, dw.start, dw.end) == (0, pytest.approx(us(1)), pytest.approx(us(5))) and sd.unsafe_frees == []


def test_contention_chapter_picture_supports_the_prose():
    "nbs/04_contention.ipynb's picture."
    # "free overlap vs contention: the big branches take (a hair more than) twice as long, the small ones are untouched"
    gm = big_and_small_branches()
    c = lambda n: us(5) if n.name.startswith("small") else get_roofline_estimate(n)
    free, cont = simulate(gm, cost=c), simulate(gm, cost=c, contention=True)
    end = lambda tl, pre: max(e for k, (_, _, e) in tl.spans.items() if k.startswith(pre))
    assert 2 * end(free, "big") <= end(cont, "big") < 2.01 * end(free, "big")
    assert end(cont, "small") == end(free, "small") == pytest.approx(us(15))
    assert cont.makespan_us > 2 * free.makespan_us - 1e-9


# ---------------------------------------------------------------- bad arguments, malformed stream ops

def _small():
    from streamnb.graph import GraphBuilder
    b = GraphBuilder(); x = b.input("x")
    m = b.op(torch.ops.aten.mul.Tensor, x, 2.0, stream=1)
    w = b.graph.call_function(torch.ops.streams.wait_event.default, (7, 0))
    return b.output(m), w


@pytest.mark.parametrize("call,msg", [
    (lambda gm: simulate(None), "gm: expected a torch.fx.GraphModule, got NoneType"),
    (lambda gm: simulate(gm.graph), "pass the GraphModule, not its .graph"),
    (lambda gm: simulate(gm, cost=3), "cost: expected"),
    (lambda gm: simulate(gm, registry={}), "registry: expected a StreamRegistry"),
    (lambda gm: simulate(gm, launch_overhead="1"), "launch_overhead: expected"),
    (lambda gm: simulate(gm, device=None), "device: expected"),
    (lambda gm: simulate(gm, contention="yes"), "contention: expected"),
])
def test_wrong_argument_types_name_the_argument(call, msg):
    gm, _ = _small()
    with pytest.raises(TypeError, match=msg):
        call(gm)


@pytest.mark.parametrize("cost", [lambda n: "x", lambda n: None, {"mul": "1"}, lambda n: True])
def test_cost_not_a_number_is_a_type_error_naming_the_node(cost):
    gm, _ = _small()
    with pytest.raises(TypeError, match="^node mul: cost "):
        simulate(gm, cost=cost)


@pytest.mark.parametrize("args", [(7,), (7, 1.5), (7, -1), (2**63, 0)])
def test_malformed_stream_op_is_an_error_not_the_current_stream(args):
    from streamnb.streamops import StreamOpError
    gm, w = _small()
    w.args = args
    with pytest.raises(StreamOpError, match=f"^node {w.name}: "):
        simulate(gm, cost=lambda n: 0.001)


# --- what real kernels add (chapter 03's `calibrated` devices): each field of DeviceSpec by hand. The table's rows keep
# them at their ideal defaults, so every test above is the ideal model unchanged.

import dataclasses

from streamnb.contention import Demand
from streamnb.cost import calibrated, get_device_spec
from streamnb.simulator import us


def _h100(**fields):
    return dataclasses.replace(get_device_spec("H100"), **fields)


def test_host_wake_makes_a_blocking_host_slower():
    # p (10 µs) on stream 1; the host blocks on stream 1, wakes up (5 µs), then issues q (10 µs):
    # ideal: p 0-10, q 10-20; with host_wake_us=5: q 15-25. A program that does not block runs p and q side by side.
    def graph(block):
        b = GraphBuilder()
        x = b.input("x")
        p = b.op(aten.neg.default, x, stream=1, name="p")
        if block: b.sync(streams.synchronize_stream.default, 1)
        q = b.op(aten.neg.default, x, stream=2, name="q")
        return b.output(p, q)
    cost = {"p": us(10), "q": us(10)}
    assert simulate(graph(True), cost=cost).spans["q"] == (2, us(10), us(20))
    woke = simulate(graph(True), cost=cost, device=_h100(host_wake_us=5.0))
    assert woke.spans["q"] == (2, pytest.approx(us(15)), pytest.approx(us(25)))
    assert [(w.op, w.start, w.end) for w in woke.waits] == [("synchronize_stream", 0.0, us(10))]   # the wait itself
    assert woke.makespan == pytest.approx(us(25))
    assert simulate(graph(False), cost=cost, device=_h100(host_wake_us=5.0)).makespan == us(10)
    assert calibrated("H100").host_wake_us > 0      # the calibrated model charges it


def test_launch_overhead_defaults_to_the_devices_host_issue():
    # host_issue_us=2: the host issues k0, k1, k2 at 2, 4, 6 µs; each takes 0.1 µs: k2 ends at 6.1 µs.
    tl = simulate(chain([0.1] * 3), cost=lambda n: us(0.1), device=_h100(host_issue_us=2.0))
    assert [tl.spans[f"k{i}"][1] for i in range(3)] == pytest.approx([us(2), us(4), us(6)])
    assert tl.makespan == pytest.approx(us(6.1))
    assert simulate(chain([0.1] * 3), cost=lambda n: us(0.1), device=_h100(host_issue_us=2.0),
                    launch_overhead=0.0).makespan == pytest.approx(us(0.3))   # an explicit launch_overhead wins


def test_dispatch_rate_spaces_kernel_starts_across_streams():
    # a and b, 10 µs each, on two streams, ready at 0, tiny demands: with dispatch_us=1 the GPU starts a at 0 and b at
    # 1 µs (b ends at 11 µs); without contention the dispatch rate is not modelled (both start at 0).
    b = GraphBuilder()
    x = b.input("x")
    gm = b.output(b.op(aten.neg.default, x, stream=1, name="a"), b.op(aten.neg.default, x, stream=2, name="b"))
    small = {"a": Demand(0.01, 0.01), "b": Demand(0.01, 0.01)}
    cost = {"a": us(10), "b": us(10)}
    tl = simulate(gm, cost=cost, contention=small, device=_h100(dispatch_us=1.0))
    assert tl.spans == {"a": (1, 0.0, us(10)), "b": (2, us(1), pytest.approx(us(11)))}
    assert tl.makespan == pytest.approx(us(11))
    assert simulate(gm, cost=cost, contention=small).spans["b"] == (2, 0.0, us(10))
    assert simulate(gm, cost=cost, device=_h100(dispatch_us=1.0)).spans["b"] == (2, 0.0, us(10))


def test_calibrated_kernels_overlap_their_fixed_time_and_idle_sms():
    # Two 1×1 convolutions 1280 -> 320 on an 8×8 map (float32, V100, calibrated), on two streams, no host cost:
    # alone each takes 3 µs + 6.68 µs / 0.125 (occupancy 20480 / (80 · 2048)) = 56.4 µs, with compute demand
    # 6.68 / 56.4 = 0.118 < 0.125: together they ask 0.237 of the device, so both run at full speed side by side;
    # the second starts 0.5 µs later (dispatch). One stream: 2 × 56.4 µs.
    def convs(same):
        b = GraphBuilder()
        x, w = b.input("x", shape=(1, 1280, 8, 8)), b.input("w", shape=(320, 1280, 1, 1))
        c = [b.op(aten.convolution.default, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, stream=1 if same else s,
                  name=f"c{s}") for s in (1, 2)]
        return b.output(*c)
    v100 = dataclasses.replace(calibrated("V100"), host_issue_us=0.0)
    one_ms = 3e-3 + 52428800 / (0.5 * 15.7e12 * 0.125) * 1e3
    two = simulate(convs(False), device=v100, contention=True)
    assert two.spans["c2"] == (2, pytest.approx(us(0.5)), pytest.approx(us(0.5) + one_ms))
    assert two.makespan == pytest.approx(us(0.5) + one_ms)
    assert simulate(convs(True), device=v100, contention=True).makespan == pytest.approx(2 * one_ms)
    ideal = simulate(convs(True), device="V100", contention=True).makespan      # the ideal model: 2 × 4.45 µs
    assert ideal == pytest.approx(2 * 52428800 / (0.75 * 15.7e12) * 1e3)
