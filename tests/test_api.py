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

