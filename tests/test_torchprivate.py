"""The fence for torch's private names (`streamnb.torchprivate`, appendix 91): each probed name deleted in a fresh
process turns its feature off with the name in the reason, `import streamnb` still works, and `need` raises; the
torch-upgrade section of CONTRIBUTING.md is the table's."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from streamnb import torchprivate as tp

ROOT = Path(__file__).resolve().parent.parent

# One process: for each feature, each of its names deleted in turn (torchprivate imported afresh, the feature's
# status read, the name put back), then all of them at once with a fresh `import streamnb`. A name is deleted as an upgrade would: a module made unimportable (and dropped from its package), an
# attribute deleted from its module or class, an instance attribute dropped after `__init__` (or, where the class is
# written in C, shadowed by one that raises AttributeError), a closure no longer made.
SCRIPT = r'''
import importlib, json, sys
import torch, torch.fx
import streamnb.torchprivate as tp0

def owner_and_attr(name):
    parts = name.split(".")
    for k in range(len(parts) - 1, 0, -1):
        try: mod = importlib.import_module(".".join(parts[:k])); break
        except ImportError: continue
    obj = mod
    for p in parts[k:-1]: obj = getattr(obj, p.rstrip("()"))
    return obj, parts[-2].endswith("()"), parts[-1]

def delete(name):
    "Delete `name`; return how to put it back."
    if name.endswith(">"):   # a closure: the function that made it, replaced by one that makes none
        mod, attr, _ = name.rsplit(".", 2)
        m = importlib.import_module(mod); old = getattr(m, attr)
        setattr(m, attr, lambda value, source: 0)
        return lambda: setattr(m, attr, old)
    try:
        importlib.import_module(name)   # a module
        parent, attr = name.rsplit(".", 1); pm = importlib.import_module(parent)
        old_mod, old_attr = sys.modules[name], getattr(pm, attr)
        sys.modules[name] = None; delattr(pm, attr)
        def put_back(): sys.modules[name] = old_mod; setattr(pm, attr, old_attr)
        return put_back
    except ImportError: pass
    owner, instance, attr = owner_and_attr(name)
    if instance:   # an attribute of instances of `owner`
        if attr in {k for c in owner.__mro__ if c.__module__ == "torch._C" for k in vars(c)}:
            setattr(owner, attr, property(lambda self: (_ for _ in ()).throw(AttributeError(attr))))
            return lambda: delattr(owner, attr)
        init = owner.__init__
        def without(self, *a, **k): init(self, *a, **k); self.__dict__.pop(attr, None)
        owner.__init__ = without
        return lambda: setattr(owner, "__init__", init)
    old = getattr(owner, attr); delattr(owner, attr)   # (a class's own `__init__`: then it inherits one)
    return lambda: setattr(owner, attr, old)

def fresh(all_of_streamnb):
    "Import torchprivate afresh (it probes again), or with `all_of_streamnb` every streamnb module."
    for m in [m for m in sys.modules if (m == "streamnb" or m.startswith("streamnb.")) and
              (all_of_streamnb or m == "streamnb.torchprivate")]: del sys.modules[m]
    import streamnb, streamnb.torchprivate as tp, streamnb.pipeline, streamnb.capturing, streamnb.compiling
    return tp

def status(tp, feature):
    try: tp.need(feature); raised = ""
    except tp.TorchPrivateError as e: raised = str(e)
    return {"why": tp.why_off(feature), "raised": raised, "others_on": [f for f in tp.FEATURES if f != feature and tp.on(f)]}

out = {}
for feature in tp0.FEATURES:
    names = list(dict.fromkeys(p.name for p in tp0.PRIVATE if p.feature == feature))
    out[feature] = {}
    for name in names:   # one at a time: the probe names it
        put_back = delete(name)
        try: out[feature][name] = status(fresh(False), feature)
        finally: put_back()
    put_backs = [delete(name) for name in reversed(names)]   # all at once (members before their class): a fresh
    # `import streamnb` still works
    try:
        tp = fresh(True)
        out[feature]["<all>"] = {"imported": True, "on": tp.on(feature)}
    except Exception as e:
        out[feature]["<all>"] = {"imported": False, "error": f"{type(e).__name__}: {e}"}
    finally:
        for put_back in reversed(put_backs): put_back()
tp = fresh(True)
out["<restored>"] = {f: tp.on(f) for f in tp.FEATURES}
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def deleted():
    "The script's findings, run once: {feature: {name: status, '<all>': import}, '<restored>': {feature: on}}."
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def test_the_deletions_are_undone(deleted):
    assert all(deleted["<restored>"].values()), deleted["<restored>"]


@pytest.mark.parametrize("feature", list(tp.FEATURES))
def test_each_missing_name_turns_its_feature_off_and_says_why(feature, deleted):
    out = dict(deleted[feature])
    everything = out.pop("<all>")
    assert everything["imported"] and not everything["on"], everything   # import streamnb never fails
    assert set(out) == {x.name for x in tp.PRIVATE if x.feature == feature}
    for name, r in out.items():
        assert f"`{name}`" in r["why"], (name, r["why"])                 # the feature is off and names the name
        assert r["why"] in r["raised"] and "is off" in r["raised"], (name, r)   # its use raises, saying why
        sharing = {x.feature for x in tp.PRIVATE if x.name == name}
        assert set(tp.FEATURES) - set(r["others_on"]) == sharing, (name, r["others_on"])   # only its features are off


def test_every_feature_is_on_with_the_pinned_torch():
    assert {f: tp.why_off(f) for f in tp.FEATURES} == {f: "" for f in tp.FEATURES}, tp.report()


def test_no_module_reaches_a_private_name_the_table_lacks():
    "Every private module a library module imports from torch is one of the table's (or its prefix)."
    import re
    known = {p.name for p in tp.PRIVATE} | {"torch._dynamo.variables.streams", "torch._inductor.fx_passes.control_dependencies"}
    prefixes = {".".join(n.split(".")[:k]) for n in known for k in range(2, len(n.split(".")) + 1)}
    found = set()
    for f in (ROOT / "streamnb").glob("*.py"):
        if f.name in ("_modidx.py", "torchprivate.py"): continue
        for m in re.finditer(r"^\s*(?:from|import) (torch(?:\.\w+)*\._\w+(?:\.\w+)*)", f.read_text(), re.M):
            found.add((f.name, m.group(1)))
    allowed = {"torch.utils._pytree"}   # the pytree utilities: the stream-op vocabulary's, see CONTRIBUTING
    assert sorted((f, m) for f, m in found if m not in prefixes and m not in allowed) == []


def test_contributing_upgrade_section_is_the_table():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert tp.upgrade_section() in text, "run python tools/torchprivate.py --write"
