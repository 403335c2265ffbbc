"""Issue 22, requirement 5: the registry is per thread. Four threads, each inside its own
`use_registry(StreamRegistry(...))`, run the pipeline on their own graphs at the same time, many times, interleaved by
a barrier and a tiny switch interval; every graph they make is the graph one thread alone makes (event and
current-stream indices included: `canonical(..., rename_events=False)`), and so is each registry's record."""
import sys
import threading

import pytest

from graphgen import random_alias_graph, random_backward_graph
from streamnb.graph import StreamRegistry, canonical, get_registry, use_registry
from streamnb.pipeline import run_stream_passes

N_THREADS, ROUNDS = 4, 6


def make(k, i):
    "Thread k's i-th graph: unannotated nodes (current-stream indices are handed out) and user syncs."
    if i % 2: return random_alias_graph(1000 * k + i, n_nodes=14, p_unannotated=0.3, p_user_sync=0.2, p_keyword=0.0)
    return random_backward_graph(1000 * k + i, n_nodes=20, n_streams=3, p_unannotated=0.4, p_user_sync=0.2)


def one(k, i, barrier=None):
    reg = StreamRegistry(start=100)   # no pinned current stream: each lookup hands out a fresh index
    gm = make(k, i)
    with use_registry(reg):
        if barrier is not None: barrier.wait()
        run_stream_passes(gm)
        assert get_registry() is reg
    return canonical(gm, rename_events=False), (list(reg.events), sorted(reg.current_streams))


@pytest.fixture
def fast_switching():
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_four_threads_give_the_graphs_of_one(fast_switching):
    expected = {(k, i): one(k, i) for k in range(N_THREADS) for i in range(ROUNDS)}
    got, errors = {}, []
    barrier = threading.Barrier(N_THREADS)
    outer = get_registry()

    def work(k):
        try:
            for i in range(ROUNDS): got[k, i] = one(k, i, barrier)
        except BaseException as e:   # reported below, with the thread
            errors.append((k, e)); barrier.abort()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(N_THREADS)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    assert get_registry() is outer
    bad = [key for key in expected if got[key] != expected[key]]
    print(f"\n{len(got)} graphs from {N_THREADS} threads; {len(bad)} differ from one thread's")
    assert not bad, f"{len(bad)} of {len(expected)} differ, e.g. thread {bad[0][0]} round {bad[0][1]}"
