"""`import streamnb` on other torch releases: a warning off the tested ones, a clear ImportError without the internals it
needs. An import runs in a fresh interpreter, with `torch.__version__` set before streamnb sees it."""
import json
import sys

import pytest
import torch

import streamnb
from loads import run_fresh

IMPORT = """
import json, warnings, torch
torch.__version__ = {version!r}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import streamnb
print(json.dumps([[w.category.__name__, str(w.message)] for w in caught if w.filename == streamnb.__file__]))
"""


def warnings_on(version):
    "The warnings streamnb's own code emits while it is imported in a fresh interpreter, as if torch were `version`."
    return json.loads(run_fresh(IMPORT.format(version=version)).splitlines()[-1])   # (torch imported, not streamnb)


def test_tested_release_imports_silently():
    assert warnings_on("2.13.0") == []


def test_other_release_warns_once():
    (w,) = warnings_on("2.14.0")
    assert w[0] == "UserWarning"
    assert w[1].startswith("streamnb: torch 2.14.0 is not a release streamnb was checked on (2.13)")
    assert "FX's public path is used" in w[1]


@pytest.mark.parametrize("version, warns", [("2.13.0+cpu", False), ("2.13.1+cu128", False), ("2.14.0", True),
                                            ("2.130.0", True), ("3.13.0", True)])
def test_release_is_major_minor(monkeypatch, recwarn, version, warns):
    "The check the import runs, in this process: 2.13.x in any build is tested, 2.130 is not."
    monkeypatch.setattr(torch, "__version__", version)
    streamnb._check_torch()
    assert [str(w.message).split(" is not")[0] for w in recwarn] == ([f"streamnb: torch {version}"] if warns else [])


def test_torch_without_the_stream_ops_is_refused(monkeypatch):
    "A torch without the module that registers torch.ops.streams (as before 2.13): an ImportError that says so."
    monkeypatch.setattr(torch, "__version__", "2.12.0")
    monkeypatch.setitem(sys.modules, "torch._dynamo.variables.streams", None)   # find_spec: not found
    with pytest.raises(ImportError, match=r"^streamnb needs torch>=2\.13: torch 2\.12\.0 has no "
                                          r"torch\._dynamo\.variables\.streams$"):
        streamnb._check_torch()
