"""Execute notebooks in place, their outputs and figures saved, in this process (execnb; no Jupyter kernel needed).
    python tools/run_nb.py nbs/19a_cuda_demos.ipynb [more...]
Exit status 1 if any cell raised; the notebook is saved with every output either way (the error's cell shows it)."""
import json, sys
from pathlib import Path
from execnb.shell import CaptureShell

failed = []
for p in map(Path, sys.argv[1:]):
    shell = CaptureShell(path=p.parent.resolve(), mpl_format="png")
    shell.execute(p, p, exc_stop=False)
    errors = [c for c in json.loads(p.read_text())["cells"] if c["cell_type"] == "code"
              for o in c.get("outputs", []) if o.get("output_type") == "error"]
    print(f"{p}: {len(errors)} cell(s) raised")
    if errors: failed.append(str(p))
sys.exit(1 if failed else 0)
