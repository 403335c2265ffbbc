"""Which of streamnb's modules importing one of them loads, measured in a fresh interpreter with the package's
`__init__` (which imports every module) bypassed: the layering of the library, checked by running it.

Each question runs in a process of its own that has imported nothing of streamnb: a fork of one helper process per
test process, which has imported torch (the slow part of every start: 2-3 s each on a quiet machine, 10-20 s on a
busy one) and nothing else. Which streamnb modules an import loads does not depend on torch being loaded already."""
import atexit
import json
import subprocess
import sys
from pathlib import Path

import streamnb

PATH = str(Path(streamnb.__file__).parent)

# The helper: reads one JSON request a line ({"code": ...}), runs the code in a fork, answers its last line of output.
_HELPER = r"""
import io, json, os, sys, traceback
import torch
for line in sys.stdin:
    code = json.loads(line)["code"]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        sys.stdout = io.StringIO()
        try:
            exec(compile(code, "<fresh>", "exec"), {"__name__": "__fresh__"})
            answer = {"ok": True, "out": sys.stdout.getvalue()}
        except BaseException:
            answer = {"ok": False, "out": sys.stdout.getvalue(), "error": traceback.format_exc()}
        os.write(w, json.dumps(answer).encode()); os.close(w)
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16): data += chunk
    os.close(r); os.waitpid(pid, 0)
    sys.__stdout__.write((data.decode() or json.dumps({"ok": False, "out": "", "error": "the fork died"})) + "\n")
    sys.__stdout__.flush()
"""
_helper = None


def run_fresh(code: str) -> str:
    "The output of `code` run in a process that has imported torch and nothing of streamnb; fails on an error there."
    global _helper
    if _helper is None or _helper.poll() is not None:
        _helper = subprocess.Popen([sys.executable, "-c", _HELPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        atexit.register(_helper.kill)
    _helper.stdin.write(json.dumps({"code": code}) + "\n"); _helper.stdin.flush()
    answer = json.loads(_helper.stdout.readline())
    assert answer["ok"], answer["error"]
    return answer["out"]


_CODE = """
import importlib, json, sys, types
pkg = types.ModuleType("streamnb"); pkg.__path__ = [{path!r}]; sys.modules["streamnb"] = pkg   # no __init__ run
importlib.import_module("streamnb." + {name!r})
print(json.dumps(sorted(m.split(".", 1)[1] for m in sys.modules if m.startswith("streamnb."))))
"""


def modules_loaded_by(name: str) -> set[str]:
    "The streamnb modules (short names) that `import streamnb.<name>` loads, `name` included."
    return set(json.loads(run_fresh(_CODE.format(path=PATH, name=name)).splitlines()[-1]))
