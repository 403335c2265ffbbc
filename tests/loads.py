"""Which of streamnb's modules importing one of them loads, measured in a fresh interpreter with the package's
`__init__` (which imports every module) bypassed: the layering of the library, checked by running it."""
import json
import subprocess
import sys
from pathlib import Path

import streamnb

_CODE = """
import importlib, json, sys, types
pkg = types.ModuleType("streamnb"); pkg.__path__ = [{path!r}]; sys.modules["streamnb"] = pkg   # no __init__ run
importlib.import_module("streamnb." + {name!r})
print(json.dumps(sorted(m.split(".", 1)[1] for m in sys.modules if m.startswith("streamnb."))))
"""


def modules_loaded_by(name: str) -> set[str]:
    "The streamnb modules (short names) that `import streamnb.<name>` loads, `name` included."
    code = _CODE.format(path=str(Path(streamnb.__file__).parent), name=name)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout.splitlines()[-1]))
