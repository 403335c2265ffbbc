"""nbdev's own docs processing (`nbdev_proc_nbs`, the first half of `nbdev_docs`) works on every notebook.

It runs every cell that contains an import, and every exported cell, with no other cell run before them: an import
cell that also uses a notebook-local name (a function defined in an earlier, unexported cell) stops it with a
NameError. Keep imports in cells of their own. Runs on a copy of the working tree, so nbs/*.yml, _proc/ and
streamnb/_modidx.py are never touched, with a stand-in `quarto` on PATH: without one, nbdev tries to download Quarto
and then runs `pip install -e .` from the copy (repointing the venv's editable install at it)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    env = {**os.environ, "PATH": f"{stub}:{Path(sys.executable).parent}:{os.environ['PATH']}", "MPLBACKEND": "Agg"}
    r = subprocess.run(["nbdev_proc_nbs"], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    errors = sorted(set(re.findall(r"Exception: (Error in notebook: .* in cell \d+) :", out)))
    causes = sorted(set(re.findall(r"^(\w+Error: .*)$", out, re.MULTILINE)))
    assert r.returncode == 0, ("nbdev_proc_nbs failed: " + "; ".join(errors) + " -- " + "; ".join(causes) +
                               "\n(an import cell that uses a notebook-local name: move its imports into a cell of "
                               "their own)\n" + out[-3000:])
    nbs = sorted(p.name for p in (work / "nbs").glob("*.ipynb") if not p.name.startswith("_"))
    made = sorted(p.name for p in (work / "_proc").glob("*.ipynb"))
    assert made == nbs, f"_proc/ lacks {sorted(set(nbs) - set(made))}"
