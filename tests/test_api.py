"""The public API: every module's `__all__` names real objects, and every public function and class is documented."""
import importlib
import inspect
import pkgutil

import pytest

import streamnb

MODULES = sorted(m.name for m in pkgutil.iter_modules(streamnb.__path__) if not m.name.startswith("_"))


@pytest.mark.parametrize("name", MODULES)
def test_all_is_curated_and_documented(name):
    mod = importlib.import_module(f"streamnb.{name}")
    assert mod.__doc__, f"streamnb.{name} has no module docstring"
    public = getattr(mod, "__all__", None)
    assert public is not None, f"streamnb.{name} has no __all__"
    missing = [p for p in public if not hasattr(mod, p)]
    assert not missing, f"streamnb.{name}.__all__ names what the module lacks: {missing}"
    undocumented = [p for p in public if (inspect.isfunction(obj := getattr(mod, p)) or inspect.isclass(obj))
                    and not inspect.getdoc(obj)]
    assert not undocumented, f"streamnb.{name}: public names without a docstring: {undocumented}"



def _graph_functions():
    "Every public function whose first parameter is a GraphModule: (module.name, function, parameter name)."
    from torch.fx import GraphModule
    out = []
    for name in MODULES:
        if name == "fastfx": continue   # FX building blocks under the passes (layer 0: below graph's checks)
        mod = importlib.import_module(f"streamnb.{name}")
        for p in mod.__all__:
            f = getattr(mod, p)
            if not inspect.isfunction(f): continue
            params = list(inspect.signature(f).parameters.values())
            if params and params[0].annotation in ("GraphModule", GraphModule):
                out.append(pytest.param(f, params[0].name, id=f"{name}.{p}"))
    return out


@pytest.mark.parametrize("fn, param", _graph_functions())
@pytest.mark.parametrize("bad", ["graph", None, "text"])
def test_graph_functions_name_a_wrong_argument(fn, param, bad):
    # `sanitize(gm.graph)`, `run_stream_passes(None)`: a TypeError that names the argument, not an AttributeError
    from torch.fx import Graph
    value = Graph() if bad == "graph" else bad
    with pytest.raises(TypeError, match=rf"^{param}: expected a torch.fx.GraphModule"):
        got = fn(value, *(["x"] * _required_after_first(fn)))
        if hasattr(got, "__enter__"): got.__enter__()   # a context manager checks on entry


def _required_after_first(fn) -> int:
    "How many positional arguments `fn` requires after its first (filled with a placeholder the check never reaches)."
    params = list(inspect.signature(fn).parameters.values())[1:]
    return sum(p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
               for p in params)
