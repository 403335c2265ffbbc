"""benchmarks/bench_floor.py rebuilds what the passes made, no less: a floor that built fewer objects would flatter
the claim that a target cannot be met."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
bench_floor = pytest.importorskip("bench_floor")
B = bench_floor.B

from streamnb.graph import is_control_deps  # noqa: E402
from streamnb.streamops import OPS  # noqa: E402


@pytest.mark.parametrize("row", ["streamnb upstream", "streamnb default"])
def test_the_floor_rebuilds_every_sync_subgraph_and_new_node(row):
    base = B.build("stress", 2000)
    gm = B.copy_as(base, "lazy")
    before = set(gm.graph.nodes)
    total, checks, calls = bench_floor.run_counting_checks(row, gm)
    assert 0 < checks < total
    # each check once in each public pass, wherever the pass's module binds it (assign_backward_streams reads no
    # stream op, so it decodes none)
    assert calls == {"validate": 5, "_Snapshot": 5, "already_processed": 5, "check_stream_ops": 4}, calls
    ops, wraps = bench_floor.what_was_made(gm, before, {n.name for n in base.graph.nodes})
    ctrls = [n for n in gm.graph.nodes if is_control_deps(n)]
    assert len(wraps) == len(ctrls) > 0
    new_ops = [n for n in gm.graph.nodes if n not in before and n.op == "call_function" and n.target in OPS]
    assert len(ops) == len(new_ops) > 0
    assert sum(new for *_, new in wraps) < len(wraps)   # the stress shape has user syncs: the input's, not rebuilt
    for public in (False, True):   # streamnb's fast path, and FX's public calls as torch makes the same objects
        seconds, scratch = bench_floor.build_objects(ops, wraps, public=public)
        assert seconds > 0
        built = [n for n in scratch.graph.nodes if is_control_deps(n)]
        assert len(built) == len(ctrls)
        assert sorted(len(n.args) for n in built) == sorted(len(n.args) for n in ctrls)   # as many values passed through
        assert sum(len(n.args[0]) for n in built) == sum(len(n.args[0]) for n in ctrls)   # as many deps followed
        assert len([n for n in scratch.graph.nodes if n.op == "call_function" and n.target in OPS]) == len(ops)
        assert len([m for m in scratch.children()]) == len(ctrls)   # a subgraph module each
