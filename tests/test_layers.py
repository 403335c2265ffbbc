"""The layer map (tools/layers.py, rendered in CONTRIBUTING.md): every module's imports parsed against it."""
import ast
import importlib.util
import pkgutil
import sys
from pathlib import Path

import pytest

import streamnb

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("layers", ROOT / "tools" / "layers.py")
layers = importlib.util.module_from_spec(spec); spec.loader.exec_module(layers)
ORDER = layers.order()
MODULES = sorted(m.name for m in pkgutil.iter_modules(streamnb.__path__) if not m.name.startswith("_"))

def imports(mod: str) -> list[tuple[str, bool]]:
    "(streamnb module imported, inside a function body?) for every import statement of `mod`."
    tree = ast.parse((ROOT / "streamnb" / f"{mod}.py").read_text())
    out = []
    def visit(node, in_fn):
        for ch in ast.iter_child_nodes(node):
            f = in_fn or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(ch, ast.ImportFrom):
                if ch.level == 1 and ch.module: out.append((ch.module.split(".")[0], f))
                elif ch.level == 1: out.extend((a.name, f) for a in ch.names)
                elif (ch.module or "").startswith("streamnb."): out.append((ch.module.split(".")[1], f))
            elif isinstance(ch, ast.Import):
                out.extend((a.name.split(".")[1], f) for a in ch.names if a.name.startswith("streamnb."))
            visit(ch, f)
    visit(tree, False)
    return out

def test_every_module_is_in_the_table_once():
    assert sorted(ORDER) == MODULES
    assert len(ORDER) == len(set(ORDER))

def violations(mod: str, order: list[str]) -> list[str]:
    "What `mod`'s imports break in the layer map `order`."
    out = []
    for dep, in_fn in imports(mod):
        if in_fn: out.append(f"{mod} imports streamnb.{dep} inside a function body")
        if order.index(dep) >= order.index(mod): out.append(f"{mod} imports {dep}, which the layer map lists after it")
        if dep == "exercises" and mod not in layers.GRADED: out.append(f"{mod} is library code and imports the graders")
    return out

@pytest.mark.parametrize("mod", MODULES)
def test_imports_only_modules_before_it_and_never_in_a_function(mod):
    assert violations(mod, ORDER) == []

def test_appendix_modules_import_only_appendix_modules():
    chap = layers.chapters(ROOT / "nbs")
    for mod in MODULES:
        if chap[mod].startswith("9"): assert all(chap[dep].startswith("9") for dep, _ in imports(mod)), mod

def test_the_table_is_in_notebook_order_but_for_the_named_exceptions():
    chap = layers.chapters(ROOT / "nbs")
    ordered = [m for m in ORDER if m not in layers.OUT_OF_ORDER]
    assert ordered == sorted(ordered, key=chap.__getitem__)
    for m in layers.OUT_OF_ORDER:   # an exception that is no longer one must leave the list
        rest = [o for o in ORDER if o not in layers.OUT_OF_ORDER or o == m]
        assert rest != sorted(rest, key=chap.__getitem__), f"{m} is in notebook order now: drop it from OUT_OF_ORDER"

def test_contributing_shows_the_table():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert layers.render(layers.chapters(ROOT / "nbs")) in text, "run python tools/layers.py --write"

def test_the_check_catches_a_late_import():
    "Break the map on purpose: the command listed before `choosing`, which it imports."
    order = [m for m in ORDER if m != "cli"]
    order.insert(order.index("choosing"), "cli")
    assert "cli imports choosing, which the layer map lists after it" in violations("cli", order)
