"""The FX fast path (`streamnb.fastfx`) against FX's public path: the passes give the same graphs, the same subgraph
modules (class, attributes, code) and the same node metadata with the fast path on and off."""
import gc

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx import GraphModule

import graphgen
from streamnb import fastfx
from streamnb.capturing import capture
from streamnb.examples import MODELS, make_model
from streamnb.graph import StreamRegistry, canonical, use_registry
from streamnb.pipeline import run_stream_passes


def _module_state(m):
    skip = {"_graph", "_code", "_in_spec", "_out_spec"}
    state = {k: (type(v), v if not isinstance(v, (dict, list, set)) else len(v)) for k, v in vars(m).items() if k not in skip}
    return type(m).__name__, type(m).__qualname__, type(m).__module__, state, m.code


def _run(seed, fast, upstream, monkeypatch):
    monkeypatch.setattr(fastfx, "FAST", fast)
    gm = graphgen.random_backward_graph(seed, n_nodes=40)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm, upstream=upstream)
    subs = {n: _module_state(m) for n, m in gm.named_children()}
    names = [(g._graph_namespace._used_names, g._graph_namespace._base_count)
             for g in [gm.graph, *(m.graph for _, m in gm.named_children())]]
    metas = [(n.name, sorted(n.meta)) for n in gm.graph.nodes]
    return canonical(gm), subs, metas, gm.code, names


@pytest.mark.skipif(not fastfx.fast_path_enabled(), reason=f"the fast path is written for torch {fastfx.FAST_FX_TORCH}")
@pytest.mark.parametrize("upstream", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_fast_path_builds_what_the_public_path_builds(seed, upstream, monkeypatch):
    assert _run(seed, True, upstream, monkeypatch) == _run(seed, False, upstream, monkeypatch)


def test_fast_path_is_off_on_other_torch_versions(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert not fastfx.fast_path_enabled()


def test_pipeline_restores_the_garbage_collector_also_on_error():
    assert gc.isenabled()
    gm = graphgen.random_backward_graph(0, n_nodes=20)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["custom"] = {"stream": "x"}
    with pytest.raises(Exception, match=node.name):
        run_stream_passes(gm)
    assert gc.isenabled()


def test_module_caches_do_not_grow_with_the_graphs():
    "fastfx caches one name per op, not per node: a pipeline run leaves no growing global state."
    def run(n):
        gm = graphgen.random_backward_graph(0, n_nodes=n)
        with use_registry(StreamRegistry(start=100, current_stream=0)):
            run_stream_passes(gm)
    run(200)
    size = len(fastfx._TARGET_NAMES)
    run(400)
    assert len(fastfx._TARGET_NAMES) == size


def test_split_name_is_fx_name_regex():
    "`_split_name` gives what FX's `_name_regex` gives (base, number) on generated names, or None where it fails."
    import random
    import re
    from torch.fx.graph import _name_regex
    rng = random.Random(0)
    alphabet = "ab_Z0129.é-１"
    for _ in range(20000):
        c = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        m = _name_regex.match(c) if re.fullmatch(r"[0-9a-zA-Z_]*", c) else None   # else: FX's create_name, which
        want = None if m is None else (m.group(1), None if m.group(2) is None else int(m.group(2)))   # replaces first
        assert fastfx._split_name(c) == want, c


def _same_code(a, b):
    return (a.src, a.globals, a._lineno_map, a._prologue_start) == (b.src, b.globals, b._lineno_map, b._prologue_start)


def _emitted_is_fx(gm):
    "streamnb's emitter handles `gm`'s graph itself (no fallback) and writes what FX writes."
    return _same_code(fastfx._emit(gm.graph, "self"), gm.graph.python_code(root_module="self"))


@pytest.mark.skipif(not fastfx.fast_path_enabled(), reason=f"the fast path is written for torch {fastfx.FAST_FX_TORCH}")
@settings(max_examples=60, deadline=None)
@given(graphgen.graphs(), st.booleans())
def test_python_code_is_fx_on_generated_graphs(gm, upstream):
    assert _emitted_is_fx(gm)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm, upstream=upstream)
    assert _emitted_is_fx(gm)


@pytest.mark.skipif(not fastfx.fast_path_enabled(), reason=f"the fast path is written for torch {fastfx.FAST_FX_TORCH}")
@pytest.mark.parametrize("seed", range(3))
def test_python_code_is_fx_on_random_dags(seed):
    gm = graphgen.random_dag_graph(seed, n_ops=300)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm)
    assert _emitted_is_fx(gm)


@pytest.mark.skipif(not fastfx.fast_path_enabled(), reason=f"the fast path is written for torch {fastfx.FAST_FX_TORCH}")
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("name", MODELS)
def test_python_code_is_fx_on_real_models(name):
    "AOTAutograd's joint graph (pytree CodeGen), processed, and its forward and backward after partitioning."
    model, inputs = make_model(name)
    cap = capture(model, *inputs)
    done = cap.process()
    for gm in (cap.joint, done.joint, done.forward, done.backward):
        assert _emitted_is_fx(gm)


def test_recompile_is_gm_recompile_and_leaves_the_graph_alone(monkeypatch):
    gm = graphgen.random_backward_graph(3, n_nodes=40)
    with use_registry(StreamRegistry(start=100, current_stream=0)):
        run_stream_passes(gm)   # the wrap pass ends with fastfx.recompile
    code = gm.code
    gm.recompile()
    assert gm.code == code and "python_code" not in vars(gm.graph)
    def broken(self): raise RuntimeError("recompile failed")
    monkeypatch.setattr(GraphModule, "recompile", broken)
    with pytest.raises(RuntimeError, match="recompile failed"):
        fastfx.recompile(gm)
    assert "python_code" not in vars(gm.graph)   # the graph's own python_code again, also on error
