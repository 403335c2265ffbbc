"""Tests for streamnb.examples' running example: the seed visibly fails on it in program order, streamnb does not."""
import pytest
import torch

from loads import modules_loaded_by
from streamnb.examples import running_example
from streamnb.graph import StreamRegistry, canonical, get_stream, is_gradient_acc, use_registry
from streamnb.pipeline import run_stream_passes
from streamnb.sanitizer import sanitize
from streamnb.simulator import simulate


def processed(upstream, **kw):
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        return run_stream_passes(running_example(**kw), upstream=upstream)


@pytest.fixture(scope="module")
def seed(): return processed(True)


@pytest.fixture(scope="module")
def ours(): return processed(False)


def test_shape_of_the_example():
    gm = running_example()
    nodes = {n.name: n for n in gm.graph.nodes}
    assert len(nodes) <= 30                                   # small enough to read
    assert not any(n.op == "call_function" and n.target.namespace == "streams" for n in gm.graph.nodes)   # no syncs
    assert [n for n in nodes if is_gradient_acc(nodes[n])] == ["x1_grad", "x_grad"]
    assert all(get_stream(nodes[n]) is None for n in ("x1_grad", "x_grad"))   # the assign pass gives them streams
    assert {get_stream(nodes[n]) for n in ("mlp_grad", "gelu_grad", "ln2_grad", "wo_grad")} == {2}
    assert {get_stream(nodes[n]) for n in ("attn_grad", "ln1_grad")} == {1}
    assert {get_stream(nodes[n]) for n in ("scale_grad", "gamma_grad")} == {0}
    assert [u.name for u in nodes["scale_grad"].users] == ["attn_grad", "wo_grad"]
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in gm.graph.nodes if n.op != "output")


def test_fresh_and_deterministic():
    a, b = running_example(), running_example()
    assert a is not b and a.graph is not b.graph
    assert canonical(a) == canonical(b)
    assert canonical(processed(True)) == canonical(processed(True))
    assert canonical(processed(False)) == canonical(processed(False))


def test_seed_races_and_reuses_unsafely(seed):
    report = sanitize(seed)
    assert sorted(report.kinds) == ["race", "unsafe_reuse"]
    race = next(e for e in report.errors if e.kind == "race")
    assert (race.nodes[0], race.tensor, race.streams[0]) == ("wo_grad", "scale_grad", 2)   # the third stream
    reuse = next(e for e in report.errors if e.kind == "unsafe_reuse")
    assert (reuse.nodes[0], reuse.tensor, reuse.streams) == ("attn_grad", "scale_grad", (1, 0))


def test_seed_failure_shows_in_the_timeline(seed):
    tl = simulate(seed)
    assert [(r.consumer, r.producer, r.consumer_stream) for r in tl.unordered_reads] == [("wo_grad", "scale_grad", 2)]
    assert all(r.overlaps for r in tl.unordered_reads)        # wo_grad really starts before scale_grad ends
    (free,) = tl.unsafe_frees
    assert (free.tensor, free.stream, free.reader, free.reader_stream) == ("scale_grad", 0, "attn_grad", 1)
    # the side-stream reader outlives the free and stream 0's next allocation (gamma_grad)
    assert free.freed_at <= tl.spans["gamma_grad"][1] < free.read_end
    assert tl.lifetimes["gamma_grad"].alloc < free.read_end


@pytest.mark.parametrize("reorder", [False, True])
def test_streamnb_is_clean(ours, reorder):
    assert sanitize(ours, reorder=reorder).errors == []


def test_streamnb_timeline_is_clean_at_no_cost(seed, ours):
    ts, to = simulate(seed), simulate(ours)
    assert (to.unordered_reads, to.unsafe_frees) == ([], [])
    assert to.spans["wo_grad"][1] >= to.spans["scale_grad"][2]         # now ordered after its producer
    assert to.makespan <= ts.makespan * 1.01                           # the corrections cost (almost) nothing here


def test_examples_import_only_the_graph():
    "The shared examples sit low (the chapters' exercises, which use the passes, are in `streamnb.course`)."
    assert modules_loaded_by("examples") == {"examples", "graph", "fastfx", "torchprivate"}


def test_a_shared_graph_is_defined_once():
    """A graph, model or program of `streamnb.examples` is defined there only: no chapter and no test writes a copy of
    it under its name (a chapter imports it; a variant is a keyword argument of the one builder)."""
    import inspect
    import json
    import re
    from pathlib import Path
    import streamnb.examples as ex
    root = Path(__file__).resolve().parent.parent
    names = [n for n, f in vars(ex).items() if (inspect.isfunction(f) or inspect.isclass(f))
             and f.__module__ == ex.__name__ and not n.startswith("_")]
    assert {"dealloc_graph", "cross_stream", "inference_fn"} <= set(names)
    exporting = {p.stem for p in (root / "nbs").glob("*.ipynb") if re.search(r"#\|\s*(default_exp|export) examples\b",
                                                                              p.read_text())}
    copies = []
    for p in sorted((root / "nbs").glob("*.ipynb")) + sorted((root / "tests").glob("*.py")):
        if p.stem in exporting: continue
        text = (p.read_text() if p.suffix == ".py" else
                "\n".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code"))
        copies += [f"{p.name}: {n}" for n in names if re.search(rf"^(def|class) {n}\b", text, re.M)]
    assert not copies, copies
