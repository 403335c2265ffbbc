"""nbdev's own docs processing (`nbdev_proc_nbs`, the first half of `nbdev_docs`) works on every notebook.

It runs every cell that contains an import, and every exported cell, with no other cell run before them: an import
cell that also uses a notebook-local name (a function defined in an earlier, unexported cell) stops it with a
NameError. Keep imports in cells of their own. Runs on a copy of the working tree (its own `streamnb` first on
PYTHONPATH), so nbs/*.yml, _proc/ and streamnb/_modidx.py are never touched, with a stand-in `quarto` on PATH: without
one, nbdev tries to download Quarto and then runs `pip install -e .` from the copy (repointing the venv's editable
install at it). When it fails, every notebook is processed on its own (the same nbdev processors) so the message names
each failing notebook, the cell's id and source, and the error."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each notebook through nbdev's processors (what nbdev_proc_nbs's workers run), one by one; failures as JSON.
_DIAGNOSE = r"""
import json, os, sys, traceback
from pathlib import Path
from execnb.nbio import read_nb
from nbdev.config import get_config
from nbdev.doclinks import nbglob
from nbdev.processors import FilterDefaults
os.environ["IN_TEST"] = "1"
def code(s): return "\n".join(l for l in s.strip().splitlines() if not l.lstrip().startswith(("#|", "%"))).strip()
bad = []
for p in nbglob(get_config().nbs_path, func=Path):
    if p.suffix != ".ipynb": continue
    cells = read_nb(p).cells
    try: FilterDefaults()(read_nb(p))
    except Exception as e:
        cause = e.__cause__ or e
        src = str(e).partition(" :\n")[2].strip()   # nbdev's message: "Error ... in cell N :\n<source>"
        cell = next((c for c in cells if c.cell_type == "code" and code(c.source) and code(c.source) == code(src)), None)
        bad.append({"notebook": p.name, "cell_id": cell.get("id") if cell else None, "source": cell.source if cell else src,
                    "error": "".join(traceback.format_exception_only(type(cause), cause)).strip()})
print(json.dumps(bad))
"""


def _copy_tree(dst: Path):
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)


def test_nbdev_proc_nbs(tmp_path):
    work = tmp_path / "repo"; work.mkdir()
    _copy_tree(work)
    stub = tmp_path / "bin"; stub.mkdir()
    (stub / "quarto").write_text("#!/bin/sh\necho 'quarto stand-in: not used by nbdev_proc_nbs' >&2; exit 1\n")
    (stub / "quarto").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{Path(sys.executable).parent}:{os.environ['PATH']}", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(work), os.environ.get("PYTHONPATH")]))}
    # one process, the notebooks in turn (nbdev's default, a worker per core, starts torch in each of them: on a busy
    # 2-core machine 40 s against 34 s, with pytest's own two workers already on the cores)
    r = subprocess.run(["nbdev_proc_nbs", "--n_workers", "0"], cwd=work, env=env, capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        d = subprocess.run([sys.executable, "-c", _DIAGNOSE], cwd=work, env=env, capture_output=True, text=True,
                           timeout=600)
        try: bad = json.loads(d.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError): bad = []
        msg = "\n\n".join(f"{b['notebook']}, cell id {b['cell_id']}:\n{b['source']}\n-> {b['error']}" for b in bad)
        raise AssertionError(
            "nbdev_proc_nbs failed (it runs every import cell and every exported cell, nothing else, before them; "
            "an import cell that also uses a notebook-local name must be split: imports in a cell of their own):\n\n"
            + (msg or (r.stdout + r.stderr)[-3000:]))
    def rel(base): return sorted(p.relative_to(base).as_posix() for p in base.rglob("*.ipynb")
                                 if not any(s.startswith(("_", ".")) for s in p.relative_to(base).parts))
    nbs, made = rel(work / "nbs"), rel(work / "_proc")
    assert nbs and made == nbs, f"_proc/ lacks {sorted(set(nbs) - set(made))}"
