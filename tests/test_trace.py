"""streamnb.trace: the Chrome / Kineto trace structure of simulated timelines."""
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from streamnb.graph import GraphBuilder, streams
from streamnb.simulator import simulate
from streamnb.trace import HOST_TID, SYNC_TID_OFFSET, check_no_overlap, to_chrome_trace, write_chrome_trace

aten = torch.ops.aten
REC, WAIT = streams.record_event.default, streams.wait_event.default


def check_structure(trace):
    ev = trace["traceEvents"]
    assert trace["displayTimeUnit"] == "ms"
    xs = [e for e in ev if e["ph"] == "X"]
    for e in xs:
        assert {"ts", "dur", "pid", "tid", "name"} <= set(e) and e["dur"] >= 0 and e["ts"] >= 0
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in xs:   # every track an X event sits on is named
        assert (e["pid"], e["tid"]) in names
    for (pid, tid), name in names.items():
        if tid == HOST_TID:
            assert name == "host"
        elif tid >= SYNC_TID_OFFSET:
            assert name == f"stream {tid - SYNC_TID_OFFSET} (sync)"
        else:
            assert name == f"stream {tid}"
    # no overlap per track
    tracks = {}
    for e in xs:
        tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in tracks.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 for a, b in zip(spans, spans[1:]))
    # flows pair up: one s and one f per id, the f not before the s
    s = {e["id"]: e for e in ev if e["ph"] == "s"}
    f = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert s.keys() == f.keys()
    assert all(f[i]["ts"] >= s[i]["ts"] for i in s)
    assert sum(e["ph"] == "s" for e in ev) == len(s)
    return xs, s, f


def test_cross_stream_trace_exact():
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.mul.Tensor, x, x, stream=1, name="p")
    b.sync(REC, 9, 1); b.sync(WAIT, 9, 0)
    c = b.op(aten.add.Tensor, p, x, stream=0, name="c")
    tl = simulate(b.output(c), cost={"p": 2.5, "c": 1.0})
    tr = to_chrome_trace(tl, pid=7, name="est")
    xs, s, f = check_structure(tr)
    assert sorted((e["name"], e["tid"], e["ts"], e["dur"]) for e in xs) == [
        ("c", 0, 2500.0, 1000.0), ("p", 1, 0.0, 2500.0),
        ("record_event", SYNC_TID_OFFSET + 1, 2500.0, 0.0), ("wait_event", SYNC_TID_OFFSET, 0.0, 2500.0)]
    assert [(e["tid"], e["ts"]) for e in s.values()] == [(SYNC_TID_OFFSET + 1, 2500.0)]
    assert [(e["tid"], e["ts"]) for e in f.values()] == [(SYNC_TID_OFFSET, 2500.0)]
    assert {e["pid"] for e in tr["traceEvents"]} == {7}
    assert [e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"] == ["est"]


def test_overlap_is_refused():
    with pytest.raises(ValueError, match="overlaps"):
        check_no_overlap([dict(ph="X", name="a", pid=1, tid=3, ts=0.0, dur=2.0),
                          dict(ph="X", name="b", pid=1, tid=3, ts=1.5, dur=1.0)])
    check_no_overlap([dict(ph="X", name="a", pid=1, tid=3, ts=0.0, dur=2.0),
                      dict(ph="X", name="b", pid=1, tid=4, ts=1.5, dur=1.0)])


@st.composite
def graphs(draw):
    b = GraphBuilder()
    values, recorded = [b.input("x")], []
    for i in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["k", "k", "rec", "wait", "host", "dealloc"]))
        s = draw(st.integers(0, 2))
        if kind == "k":
            values.append(b.op(aten.neg.default, draw(st.sampled_from(values)), stream=s, name=f"k{i}"))
        elif kind == "rec":
            b.sync(REC, 100 + i, s); recorded.append(100 + i)
        elif kind == "wait" and recorded:
            b.sync(WAIT, draw(st.sampled_from(recorded)), s)
        elif kind == "host" and recorded:
            b.sync(streams.synchronize_event.default, draw(st.sampled_from(recorded)))
        elif kind == "dealloc" and recorded and len(values) > 1:
            b.sync(streams.sync_dealloc.default, draw(st.sampled_from(recorded)), s, values[-1])
    costs = draw(st.lists(st.sampled_from([0.0, 0.001, 0.5, 1.0, 3.0]), min_size=25, max_size=25))
    return b.output(values[-1]), (lambda n: costs[int(n.name[1:]) % 25])


@settings(max_examples=100, deadline=None)
@given(graphs())
def test_generated_traces_are_well_formed(g):
    gm, cost = g
    tl = simulate(gm, cost=cost)
    xs, s, f = check_structure(to_chrome_trace(tl))
    assert sum(e["cat"] == "kernel" for e in xs) == len(tl.spans)
    assert len(s) == len(tl.flows)


def test_write_chrome_trace_merges_timelines(tmp_path):
    b = GraphBuilder()
    x = b.input("x")
    b.op(aten.neg.default, x, stream=3, name="n")
    gm = b.output()
    tls = [simulate(gm, cost={"n": 1.0}, name="a"), simulate(gm, cost={"n": 2.0})]
    tr = write_chrome_trace(tmp_path / "t.json", *tls)
    assert json.loads((tmp_path / "t.json").read_text()) == tr
    check_structure(tr)
    assert sorted(e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name") == ["a", "timeline 1"]
    assert sorted((e["pid"], e["dur"]) for e in tr["traceEvents"] if e["ph"] == "X") == [(1000, 1000.0), (1001, 2000.0)]


def test_back_to_back_spans_do_not_overlap_after_rounding():
    # round(start) + round(dur) can exceed round(end) by 1 ns: durations come from the rounded ends instead
    from streamnb.simulator import Timeline
    tl = Timeline(spans={"a": (1, 0.0004716, 0.0011404), "b": (1, 0.0011404, 0.002)}, makespan=0.002, streams=[1])
    ev = {e["name"]: e for e in to_chrome_trace(tl)["traceEvents"] if e.get("ph") == "X"}
    assert ev["a"]["ts"] == 0.472 and ev["b"]["ts"] == 1.14
    assert ev["a"]["ts"] + ev["a"]["dur"] <= ev["b"]["ts"] + 1e-9
