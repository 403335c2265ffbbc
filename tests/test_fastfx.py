"""The FX fast path (`streamnb.fastfx`) against FX's public path: the passes give the same graphs, the same subgraph
modules (class, attributes, code) and the same node metadata with the fast path on and off; a torch whose private FX
names differ gets the public path, and the reason."""
import gc
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.fx._lazy_graph_module
from torch.fx import Graph
from torch.fx.graph import _Namespace

import graphgen
from streamnb import fastfx
from streamnb.graph import StreamRegistry, canonical, use_registry
from streamnb.pipeline import run_stream_passes

# the equivalence tests compare the fast path with the public one: with the fast path off they say why they skip
needs_fast = pytest.mark.skipif(not fastfx.FAST, reason=f"the fast path is off: {fastfx.FAST_OFF_REASON}")


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


@needs_fast
@pytest.mark.parametrize("upstream", [False, True])
@pytest.mark.parametrize("seed", range(12))
def test_fast_path_builds_what_the_public_path_builds(seed, upstream, monkeypatch):
    assert _run(seed, True, upstream, monkeypatch) == _run(seed, False, upstream, monkeypatch)


def test_fast_path_is_off_on_other_torch_versions(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert not fastfx.fast_path_enabled()
    assert "9.9.9" in fastfx._load()[1]


def _drop_instance_attr(name):
    "Graph instances without `name` (an attribute FX sets in `Graph.__init__`)."
    init = Graph.__init__
    def without(self, *a, **k):
        init(self, *a, **k)
        delattr(self, name)
    return lambda mp: mp.setattr(Graph, "__init__", without)


# every private name `_load` reaches, removed one at a time: (how to remove it, the name the reason must give)
REMOVALS = [(lambda mp: mp.delattr(torch.fx._lazy_graph_module, "_LazyGraphModule"), "_LazyGraphModule"),
            (lambda mp: mp.delattr(Graph, "_target_to_str"), "_target_to_str"),
            (_drop_instance_attr("_insert"), "_insert"),
            (lambda mp: mp.delattr(_Namespace, "create_name"), "create_name"),
            (lambda mp: mp.delattr(_Namespace, "associate_name_with_obj"), "associate_name_with_obj"),
            (lambda mp: mp.delattr(torch.fx._lazy_graph_module._LazyGraphModule, "_lazy_forward"), "_lazy_forward"),
            (_drop_instance_attr("_graph_namespace"), "_graph_namespace"),
            (_drop_instance_attr("_find_nodes_lookup_table"), "_find_nodes_lookup_table"),
            (_drop_instance_attr("_len"), "_len")]


@pytest.mark.skipif(not fastfx.fast_path_enabled(), reason=f"the fast path is off: {fastfx.FAST_OFF_REASON}")
@pytest.mark.parametrize("remove,name", REMOVALS, ids=[n for _, n in REMOVALS])
def test_a_missing_private_name_turns_the_fast_path_off_and_says_which(remove, name, monkeypatch):
    remove(monkeypatch)
    names, reason = fastfx._load()
    assert names is None and name in reason


def test_a_renamed_private_name_leaves_import_and_the_public_path_working():
    """In a fresh process where `_LazyGraphModule` is gone from its module (torch's own users keep the class, as they
    would after a rename), `import streamnb` works, the fast path is off with the reason, and `run_stream_passes`
    gives what it gives with the fast path on (here, in this process): the same graph, node names, subgraphs and code.
    One fresh process (the fast path's run needs none): two took 10 s on a quiet machine, 62 s on a busy one."""
    script = textwrap.dedent("""
        import torch.fx._lazy_graph_module as lgm
        import torch._inductor.fx_passes.control_dependencies   # takes the class by its name at import, as torch does
        Lazy = lgm._LazyGraphModule
        del lgm._LazyGraphModule
        import graphgen, oracle
        import streamnb
        from streamnb import fastfx
        from streamnb.graph import StreamRegistry, canonical, use_registry
        print(fastfx.FAST, fastfx.FAST_OFF_REASON)
        gm = oracle.copy_gm(graphgen.random_backward_graph(3, n_nodes=60), cls=Lazy)
        with use_registry(StreamRegistry(start=100, current_stream=0)): streamnb.run_stream_passes(gm)
        print(repr(canonical(gm)), gm.code, *[(n, type(m).__qualname__, m.code) for n, m in gm.named_children()])
    """)
    tests = Path(__file__).resolve().parent
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tests, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(tests)})
    assert p.returncode == 0, p.stderr
    off, public = p.stdout.split("\n", 1)
    import oracle
    assert fastfx.FAST, fastfx.FAST_OFF_REASON
    gm = oracle.copy_gm(graphgen.random_backward_graph(3, n_nodes=60), cls=torch.fx._lazy_graph_module._LazyGraphModule)
    with use_registry(StreamRegistry(start=100, current_stream=0)): run_stream_passes(gm)
    normal = io.StringIO()
    print(repr(canonical(gm)), gm.code, *[(n, type(m).__qualname__, m.code) for n, m in gm.named_children()], file=normal)
    assert off.startswith("False ") and "_LazyGraphModule" in off
    assert "control_deps" in normal.getvalue() and public == normal.getvalue()


@needs_fast
def test_global_module_registration_hooks_see_every_subgraph(monkeypatch):
    "The fast path registers each subgraph module through `setattr`, so a global registration hook sees it as on FX's."
    def registered(fast):
        seen = []
        handle = torch.nn.modules.module.register_module_module_registration_hook(lambda m, n, sub: seen.append(n))
        try: _run(5, fast, False, monkeypatch)
        finally: handle.remove()
        return seen
    fast = registered(True)
    assert fast and fast == registered(False)


def test_pipeline_restores_the_garbage_collector_also_on_error():
    assert gc.isenabled()
    gm = graphgen.random_backward_graph(0, n_nodes=20)
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["custom"] = {"stream": "x"}
    with pytest.raises(Exception, match=node.name):
        run_stream_passes(gm)
    assert gc.isenabled()
