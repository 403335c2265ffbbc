"""Render README.md from nbs/index.ipynb without Quarto (nbdev_readme needs Quarto).

What nbdev_readme does, in a few lines: cells marked `#| hide` are dropped, a `#| echo: false` cell gives its Markdown output only, other `#|` directive lines are removed,
and nbconvert renders the rest (with the saved outputs) as Markdown. Images in outputs go to README_files/.
Deterministic: run it twice, get the same files. Execute the notebook first if its outputs are stale."""
import shutil
from pathlib import Path

import nbformat
from nbconvert import MarkdownExporter

ROOT = Path(__file__).resolve().parent.parent


def main():
    nb = nbformat.read(ROOT / "nbs" / "index.ipynb", as_version=4)
    cells = []
    for c in nb.cells:
        lines = c.source.splitlines()
        directives = [ln.replace(" ", "") for ln in lines if ln.startswith("#|")]
        if "#|hide" in directives: continue
        if "#|echo:false" in directives:   # only its Markdown output, as a Markdown cell (the corrections table)
            md = [o["data"]["text/markdown"] for o in c.get("outputs", []) if "text/markdown" in o.get("data", {})]
            if md: cells.append(nbformat.v4.new_markdown_cell("\n".join(md), id=c.get("id")))
            continue
        c.source = "\n".join(ln for ln in lines if not ln.startswith("#|")).strip()
        cells.append(c)
    nb.cells = cells
    nb.metadata["language_info"] = {"name": "python"}
    body, res = MarkdownExporter().from_notebook_node(nb, resources={"output_files_dir": "README_files"})
    shutil.rmtree(ROOT / "README_files", ignore_errors=True)
    for name, data in sorted(res.get("outputs", {}).items()):
        (ROOT / name).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / name).write_bytes(data)
    (ROOT / "README.md").write_text(body.strip() + "\n", encoding="utf-8")
    print("README.md written")


if __name__ == "__main__":
    main()
