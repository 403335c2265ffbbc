"""Render README.md from nbs/index.ipynb without Quarto (nbdev_readme needs Quarto).

Does what nbdev_readme does: nbdev's notebook processors drop `#| hide` cells and turn the title cell into
front matter; nbconvert renders the rest as Markdown. Images in outputs are written next to README.md under
README_files/. Deterministic: run it twice, get the same file."""
from pathlib import Path
import shutil

import nbformat
from nbconvert import MarkdownExporter
from nbdev.config import get_config
from nbdev.serve import proc_nbs


def main():
    cfg = get_config()
    root = cfg.config_path
    proc_nbs(cfg.nbs_path, n_workers=0, files_glob="index.ipynb")
    nb = nbformat.read(root / "_proc" / "index.ipynb", as_version=4)
    nb.metadata["language_info"] = {"name": "python"}
    head = []
    if nb.cells and nb.cells[0].cell_type == "raw":
        fm = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in nb.cells.pop(0).source.splitlines() if ":" in ln)}
        head = [f"# {fm.get('title', cfg.lib_name)}", "", f"> {fm['description']}" if "description" in fm else ""]
    body, res = MarkdownExporter().from_notebook_node(nb, resources={"output_files_dir": "README_files"})
    out = root / "README_files"
    shutil.rmtree(out, ignore_errors=True)
    for name, data in sorted(res.get("outputs", {}).items()):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "README.md").write_text("\n".join(head) + "\n\n" + body.strip() + "\n", encoding="utf-8")
    print("README.md written")


if __name__ == "__main__":
    main()
