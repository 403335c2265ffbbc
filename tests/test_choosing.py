"""streamnb.strategies, streamnb.minsync and streamnb.choosing (issue 13): the three baselines and streamnb's
assignment, the fewest syncs, the table's claims."""
from __future__ import annotations

import functools
import random

import networkx as nx
import pytest
from torch.testing import assert_close

from streamnb.capturing import capture, eager
from streamnb.choosing import (STRATEGIES, assign_streams, judge, judge_one, process_capture, table_graphs,
                               without_syncs)
from streamnb.examples import transitive_wait_graph
from streamnb.exercises import count_syncs
from streamnb.minsync import (fewest_syncs_exercise, minimize_syncs, redundant_wait_graph, redundant_waits,
                              run_passes_fewest_syncs)
from streamnb.strategies import (AssignError, Dag, compute_dag, critical_path, critical_path_round_robin, max_matching,
                                 min_chain_cover, reachability, transitive_reduction)
from streamnb.examples import STREAM_MODELS, backward_like, make_model
from streamnb.graph import GraphBuilder, StreamnbError, StreamRegistry, aten, get_stream, streams, use_registry
from streamnb.pipeline import run_stream_passes
from streamnb.sanitizer import sanitize

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def reg():
    return use_registry(StreamRegistry(start=100, current_stream=0))


def build(edges: list[tuple[str, str]], names: list[str]):
    "A graph whose call nodes are `names` (in order), each reading its sources in `edges` (at most two), or the input."
    b = GraphBuilder()
    x = b.input("x")
    made = {}
    for n in names:
        ins = [made[u] for u, v in edges if v == n]
        made[n] = b.op(aten.add.Tensor, *ins, name=n) if len(ins) == 2 else b.op(aten.relu.default, (ins or [x])[0], name=n)
    return b.output(*[made[n] for n in names if not any(u == n for u, _ in edges)])


def dag_of(edges, names):
    dag = compute_dag(build(edges, names))
    assert [n.name for n in dag.nodes] == names
    return dag


# ---- Nimble: chain cover, reduction, matching ---------------------------------------------------------------------

def test_chain_cover_hand_dags():
    # a -> c <- b, c -> d, c -> e: 3 paths in the MEG (vertex-disjoint), 2 chains after merging (width 2)
    dag = dag_of([("a", "c"), ("b", "c"), ("c", "d"), ("c", "e")], ["a", "b", "c", "d", "e"])
    logical, physical = min_chain_cover(dag)
    assert len(logical) == 3 and len(physical) == 2
    # a diamond: 2 chains; a chain: 1; k independent nodes: k
    assert len(min_chain_cover(dag_of([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], list("abcd")))[1]) == 2
    assert len(min_chain_cover(dag_of([("a", "b"), ("b", "c")], list("abc")))[1]) == 1
    assert len(min_chain_cover(dag_of([], list("abcd")))[1]) == 4


def random_dag(n, p, seed):
    rnd = random.Random(seed)
    return [(i, j) for i in range(n) for j in range(i + 1, n) if rnd.random() < p]


@pytest.mark.parametrize("seed", range(12))
def test_reduction_matching_and_cover_against_networkx(seed):
    n = 14
    edges = random_dag(n, 0.25, seed)
    g = nx.DiGraph(); g.add_nodes_from(range(n)); g.add_edges_from(edges)
    succs = [[j for i2, j in edges if i2 == i] for i in range(n)]
    preds = [[i for i, j2 in edges if j2 == j] for j in range(n)]
    dag = Dag([None] * n, preds, succs, [1.0] * n, {})
    meg = transitive_reduction(dag)
    assert {(u, v) for u in range(n) for v in meg[u]} == set(nx.transitive_reduction(g).edges)
    reach = reachability(dag)
    assert all({v for v in range(n) if (reach[u] >> v) & 1} == nx.descendants(g, u) for u in range(n))
    # Hopcroft-Karp: maximum, and a matching
    match = max_matching(meg, n)
    assert len({v for v in match if v >= 0}) == sum(v >= 0 for v in match)
    b = nx.Graph(); b.add_nodes_from([("l", i) for i in range(n)]); b.add_nodes_from([("r", i) for i in range(n)])
    b.add_edges_from((("l", u), ("r", v)) for u in range(n) for v in meg[u])
    best = nx.bipartite.maximum_matching(b, top_nodes=[("l", i) for i in range(n)])
    assert sum(v >= 0 for v in match) == len(best) // 2
    # the merged chains: a cover by chains of the order, as many as the widest antichain (Dilworth)
    chains, merged = min_chain_cover(dag)
    assert sorted(v for c in merged for v in c) == list(range(n))
    for c in merged: assert all((reach[a] >> b_) & 1 for a, b_ in zip(c, c[1:]))
    closure = nx.transitive_closure_dag(g)
    comp = nx.Graph(); comp.add_nodes_from(range(n))
    comp.add_edges_from((u, v) for u in range(n) for v in range(u + 1, n) if not closure.has_edge(u, v))
    width = max(len(c) for c in nx.find_cliques(comp))
    assert len(merged) == width


def test_matching_on_a_long_chain_needs_no_recursion():
    n = 30_000
    adj = [[i + 1] if i + 1 < n else [] for i in range(n)]
    assert sum(v >= 0 for v in max_matching(adj, n)) == n - 1


# ---- apex: critical path ---------------------------------------------------------------------------------------------

def test_critical_path_known_dag():
    dag = dag_of([("a", "c"), ("b", "c"), ("c", "d"), ("c", "e"), ("a", "e")], list("abcde"))
    name = lambda vs: [dag.nodes[v].name for v in vs]
    assert name(critical_path(dag)) == ["a", "c", "d"]
    assert name(critical_path(dag, [1, 5, 1, 1, 2])) == ["b", "c", "e"]
    assert name(critical_path(dag, [9, 1, 1, 1, 1])) == ["a", "c", "d"]
    assert critical_path_round_robin(dag, [0, 1, 2]) == [0, 1, 0, 0, 2]


# ---- fewest syncs --------------------------------------------------------------------------------------------------

def waits(gm):
    "Waits before compute nodes; those before the output join returned values to the current stream (chapter 11)."
    return [(n.args[1], n.next.name) for n in gm.graph.nodes
            if n.target is streams.wait_event.default and n.next.op != "output"]


def join_syncs(gm):
    return 2 * sum(1 for n in gm.graph.nodes if n.target is streams.wait_event.default and n.next.op == "output")


def test_removes_a_provably_redundant_wait_and_keeps_a_needed_one():
    with reg():
        g = redundant_wait_graph(); from streamnb.syncs import insert_backward_syncs; insert_backward_syncs(g)
        assert waits(g) == [(2, "c1"), (2, "c2"), (0, "c0")]
        assert [w.next.name for w in redundant_waits(g)] == ["c2"]
        j = join_syncs(g)
        assert minimize_syncs(g) == (5 + j, 4 + j)
        assert waits(g) == [(2, "c1"), (0, "c0")]          # stream 0's wait for p stays: nothing else orders it
        assert redundant_waits(g) == []                    # a fixed point
        g2 = redundant_wait_graph(third_reader=False); insert_backward_syncs(g2)
        j2 = join_syncs(g2)
        assert minimize_syncs(g2) == (4 + j2, 2 + j2) and waits(g2) == [(2, "c1")]   # p's record goes with its only wait
        for gm in (redundant_wait_graph(), redundant_wait_graph(False)):
            run_passes_fewest_syncs(gm)
            assert sanitize(gm).ok and sanitize(gm, reorder=True).ok, sanitize(gm, reorder=True)


def test_removing_a_needed_wait_is_a_race():
    "The check can fail: dropping the kept wait makes the sanitizer report a race on p."
    with reg():
        g = redundant_wait_graph(); from streamnb.syncs import insert_backward_syncs; insert_backward_syncs(g)
        minimize_syncs(g)
        needed = next(n for n in g.graph.nodes if n.target is streams.wait_event.default and n.next.name == "c0")
        g.graph.erase_node(needed)
        assert "race" in sanitize(g).kinds


# ---- assign_streams ----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def captured(name):
    model, inputs = make_model(name)
    return model, inputs, capture(model, *inputs)


@pytest.mark.parametrize("name,strategy", [(n, s) for s in STRATEGIES for n in STREAM_MODELS])
def test_every_strategy_is_race_free_reorder_safe_and_matches_eager(name, strategy):
    model, inputs, cap = captured(name)
    pc = process_capture(cap, strategy=strategy)
    before, after = pc.joint.meta["streamnb_syncs"]
    assert after <= before
    with use_registry(StreamRegistry(start=100, current_stream=cap.current_stream)):
        # the backward: the passes leave the forward's streams to the user (its annotations are kept as they came)
        assert sanitize(pc.backward).ok and sanitize(pc.backward, reorder=True).ok
    got, want = pc.run(*inputs), eager(model, *inputs)
    assert_close(got.outputs, want.outputs); assert_close(got.grads, want.grads)
    assert_close(got.param_grads, want.param_grads)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_assigned_graph_goes_through_run_stream_passes(strategy):
    _, _, cap = captured("transformer_block")
    import copy
    g = copy.deepcopy(cap.backward)
    with reg():
        assign_streams(g, strategy=strategy, keep_user=False)
        run_stream_passes(g)
        assert sanitize(g).ok and sanitize(g, reorder=True).ok


def test_keep_user_and_accumulation_rule():
    _, _, cap = captured("transformer_block")
    import copy
    user = {n.name: get_stream(n) for n in cap.backward.graph.nodes if get_stream(n) is not None}
    with reg():
        g = assign_streams(copy.deepcopy(cap.backward), strategy="single")
        got = {n.name: get_stream(n) for n in g.graph.nodes}
        placed = {n.name for n in compute_dag(cap.backward).nodes}
        assert all(got[k] == v for k, v in user.items() if k in placed)
        g2 = assign_streams(copy.deepcopy(cap.backward), strategy="single", keep_user=False)
        assert {get_stream(n) for n in g2.graph.nodes if n.op == "call_function" and n.meta.get("partitioner_tag") == "is_backward"} == {0}
        # the seed's accumulation rule, run again, changes nothing
        from streamnb.assign import assign_backward_streams
        before = {n.name: get_stream(n) for n in g.graph.nodes}
        assign_backward_streams(g)
        assert {n.name: get_stream(n) for n in g.graph.nodes} == before


def test_bad_input_names_the_node_and_changes_nothing():
    with reg():
        g = backward_like(40)
        before = {n.name: get_stream(n) for n in g.graph.nodes}
        with pytest.raises(AssignError, match="record_event"): assign_streams(g)
        assert {n.name: get_stream(n) for n in g.graph.nodes} == before
        with pytest.raises(AssignError, match="unknown strategy"): assign_streams(without_syncs(g), strategy="x")
        with pytest.raises(AssignError, match="side_streams"): assign_streams(g, side_streams=-1)
        assert count_syncs(g) == 0
        g.graph.find_nodes(op="call_function", target=aten.neg.default)[0].meta.pop("val")
        before = {n.name: get_stream(n) for n in g.graph.nodes}
        with pytest.raises(StreamnbError, match="neg"): assign_streams(g)
        assert {n.name: get_stream(n) for n in g.graph.nodes} == before


# ---- the table's claims ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def table():
    return judge(table_graphs())


def test_never_worse_than_single_and_all_sanitizer_clean():
    rows, _ = table()
    by = {(r.model, r.strategy): r for r in rows}
    assert all(r.sanitizer_ok for r in rows)
    for m in {r.model for r in rows}:
        assert by[m, "streamnb"].contention_us <= by[m, "single"].contention_us * (1 + 1e-9), m
        assert by[m, "single"].streams == 1   # (its syncs: correction 29's, for what the forward made on its streams)
        assert all(r.syncs_after <= r.syncs_before for r in rows)
        assert by[m, "single"].bound_us <= by[m, "single"].contention_us + 1e-9
        assert all(by[m, s].peak_mib >= by[m, "single"].peak_mib for s in STRATEGIES)            # streams cost memory
        assert all(by[m, s].cross_edges <= by[m, "critical_path"].cross_edges for s in ("nimble", "streamnb"))
    assert 3 * by["deep_narrow", "nimble"].syncs_after <= 2 * by["deep_narrow", "nimble"].syncs_before
    assert all(r.sanitizer_error is None for r in rows)


def test_pictures_wide_pays_deep_does_not():
    "The chapter's pictures: small experts run on several streams at once; big kernels gain little under contention."
    rows, tls = table()
    by = {(r.model, r.strategy): r for r in rows}
    wide1, wide = tls["small_experts", "single"], tls["small_experts", "streamnb"]
    assert len({s for s, _, _ in wide.spans.values()}) > 1
    overlapping = sum(1 for a, (s, t0, t1) in wide.spans.items() for b, (s2, u0, u1) in wide.spans.items()
                      if s < s2 and t0 < u1 and u0 < t1)
    assert overlapping > 10
    assert wide.makespan < 0.6 * wide1.makespan                          # pays: "about half as long"
    deep = by["deep_narrow", "streamnb"]
    assert deep.free_us < 0.8 * by["deep_narrow", "single"].free_us      # free overlap promises a win ...
    assert deep.contention_us > 0.9 * by["deep_narrow", "single"].contention_us   # ... contention takes it back
    nimble = tls["deep_narrow", "nimble"]
    assert abs(nimble.makespan - tls["deep_narrow", "single"].makespan) < 1e-6 * nimble.makespan


def test_memory_limit_falls_back_to_one_stream():
    _, _, cap = captured("two_branch_mlp")
    import copy
    with reg():
        free = assign_streams(copy.deepcopy(cap.backward), keep_user=False)
        tried = free.meta["streamnb_assignment"]["tried"]
        assert len(free.meta["streamnb_assignment"]["streams"]) > 1 and tried[0][0] == "list schedule, 1 stream"
        tight = assign_streams(copy.deepcopy(cap.backward), keep_user=False, memory_limit=tried[0][2] - 1)
        assert tight.meta["streamnb_assignment"]["streams"] == [0]      # nothing fits: one stream, as a fallback
        roomy = assign_streams(copy.deepcopy(cap.backward), keep_user=False, memory_limit=10 * max(t[2] for t in tried))
        assert roomy.meta["streamnb_assignment"]["streams"] == free.meta["streamnb_assignment"]["streams"]


def test_the_estimate_streamnb_judges_is_the_tables():
    "streamnb judges proposals without the control_deps wrapping (it moves no node): the same makespan as the wrapped graph."
    gm = table_graphs()["small_experts"]
    row, tl, g = judge_one(gm, "small_experts", "streamnb")
    best = min(ms for _, ms, _ in g.meta["streamnb_assignment"]["tried"])
    assert abs(best * 1e3 - row.contention_us) < 1e-6 * row.contention_us


# ---- the chapter's exercise (nbs/21a_fewest_syncs.ipynb) -------------------------------------------------------------

def test_exercise_solution_is_ok():
    from streamnb.exercises import remove
    ex = fewest_syncs_exercise()
    answer = ex.start(); remove(answer, "wait_event_default_1")
    assert ex.check(answer).ok, ex.check(answer)
    assert ex.check(ex.best()).ok


def test_exercise_wrong_answers_are_caught():
    from streamnb.exercises import remove
    ex = fewest_syncs_exercise()
    both = ex.start(); remove(both, "wait_event_default_1"); remove(both, "wait_event_default_2")
    g = ex.check(both)
    assert not g.ok and any(p.startswith("race on p: c0") for p in g.problems), g
    untouched = ex.check(ex.start())
    assert not untouched.ok and any("1 sync more than needed" in p for p in untouched.problems), untouched


# ---- issue: the MoE block, the table's reasons, more side streams ------------------------------------------------------

import copy

import torch

from streamnb.choosing import MoEBlock, Row, format_table, table_models


MoE = MoEBlock   # the chapter's MoE block: router, shared expert, four routed experts weighted by the top-2 gates


@functools.lru_cache(maxsize=None)
def moe_backward():
    torch.manual_seed(0)
    return capture(MoE(), torch.randn(64, 256, requires_grad=True)).backward


@pytest.mark.parametrize("side_streams", [3, 4])
def test_moe_block_streamnb_choice_is_sanitizer_clean(side_streams):
    """`streamnb assign moe.py:make --side-streams 3` marked its own row ERRORS: minimize_syncs removed a wait that stream 3
    needed along data edges (it knew the value only transitively). Fails on main (streamnb row: reorderable)."""
    row, _, g = judge_one(moe_backward(), "moe", "streamnb", side_streams=side_streams)
    assert row.streams > 1
    assert row.sanitizer_ok, getattr(row, "sanitizer_error", "main's Row has no sanitizer_error")
    assert row.sanitizer_error is None


def test_a_transitively_covered_wait_is_kept_and_the_result_is_reorder_safe():
    "Fails on main: redundant_waits returned the wait before c, and the wrapped graph was not reorder-safe."
    with reg():
        from streamnb.syncs import insert_backward_syncs
        g = transitive_wait_graph(); insert_backward_syncs(g)
        assert (3, "c") in waits(g)
        assert redundant_waits(g) == []
        g = run_passes_fewest_syncs(transitive_wait_graph())
        assert sanitize(g).ok and sanitize(g, reorder=True).ok, sanitize(g, reorder=True)


def test_the_table_says_why_a_row_is_rejected(monkeypatch):
    "A rejected row carries the sanitizer's first error, and the table prints its first line. Fails on main (no field)."
    import streamnb.choosing as C
    real = C.run_passes_fewest_syncs
    def drop_waits(gm, **kw):   # a broken pass: bare syncs, every wait removed
        real(gm, **{**kw, "wrap": False})
        for n in [n for n in gm.graph.nodes if n.target is streams.wait_event.default and not n.users]:
            gm.graph.erase_node(n)
        return gm
    monkeypatch.setattr(C, "run_passes_fewest_syncs", drop_waits)
    gm = backward_like(30)
    row, _, _ = judge_one(without_syncs(gm), "toy", "critical_path")
    assert not row.sanitizer_ok and row.sanitizer_error.startswith("streamnb")
    assert format_table([row]).splitlines()[-1] == f"ERRORS in toy / critical_path: {row.sanitizer_error.splitlines()[0]}"
    ok = Row("toy", "single", 1, 0, 0, 0, 1.0, 1.0, 1.0, 1.0, True)
    assert ok.sanitizer_error is None and len(format_table([ok]).splitlines()) == 3


@functools.lru_cache(maxsize=None)
def transformer_backward():
    model, xs = table_models()["transformer_block"]
    return capture(model, *xs).backward


@pytest.mark.parametrize("graph", ["transformer_block", "moe"])
def test_more_side_streams_never_worse_on_its_own_estimate(graph):
    "Fails on main on the transformer block: 1 side stream 21.30 µs, 2 side streams 21.38 µs."
    gm = transformer_backward() if graph == "transformer_block" else moe_backward()
    got = []
    for k in range(4):
        with reg():
            g = assign_streams(copy.deepcopy(gm), side_streams=k, keep_user=False)
        got.append(min(ms for _, ms, _ in g.meta["streamnb_assignment"]["tried"]))
    assert all(b <= a * (1 + 1e-9) for a, b in zip(got, got[1:])), got
    assert got[-1] < got[0]


def test_large_graph_judged_on_the_list_model_and_never_worse_with_more_streams():
    "Above FULL_JUDGE_MAX nodes the proposals are priced by `timeline_makespan` (no simulation: no peak memory); the same guarantees hold."
    from streamnb.choosing import FULL_JUDGE_MAX, without_syncs
    from streamnb.strategies import timeline_makespan
    best = []
    for k in (0, 1, 2, 3):
        g = without_syncs(backward_like(2 * (FULL_JUDGE_MAX + 100)))
        dag = compute_dag(g, keep_user=False)
        assert len(dag.nodes) > FULL_JUDGE_MAX
        with use_registry(StreamRegistry(start=10_000, current_stream=0)):
            assign_streams(g, side_streams=k, keep_user=False)
        tried = g.meta["streamnb_assignment"]["tried"]
        assert tried[0][0] == "list schedule, 1 stream" and all(peak is None for _, _, peak in tried)
        assert tried[0][1] == pytest.approx(sum(dag.cost))   # one stream: every kernel in turn
        best.append(min(ms for _, ms, _ in tried))
    assert all(b <= a for a, b in zip(best, best[1:]))        # one more side stream never worse on its own estimate
    assert best[1] < best[0]                                   # and side streams help on this graph
