"""Build the documentation site from the committed notebooks and their stored outputs: `python tools/docs.py`.

Nothing is executed. Sphinx (myst-nb with `nb_execution_mode = "off"`, the furo theme, autodoc) renders into
settings.ini's `doc_path` (`_docs/`); open `_docs/index.html`, or serve it: `python -m http.server -d _docs`.

What this script does before Sphinx runs, in `build/docs-src/` (the notebooks in nbs/ are never touched):
- the pages: `nbs/index.ipynb` first, then every other notebook in file-name order (names starting with `_` or `.`
  are skipped), each named as nbdev names its page (`02_backward_streams.ipynb` -> `backward_streams.html`, so the
  links in `streamnb/_modidx.py` work on this site);
- nbdev's directives: `#| hide` cells are dropped, directive lines (`#| export`, `#| default_exp` ...) are removed,
  `#| hide_line` lines, `%` magics and ANSI escapes go, `#| echo: false` / `#| output: false` hide input / output,
  `#| cuda` cells get a "GPU cell" label (their outputs were recorded on a CUDA machine);
- every `#| export` cell gets anchors named as nbdev names them (`#graphbuilder`, `#capture.module`);
- one API page per module (autodoc over `__all__`), in chapter order, each symbol linked to its defining cell.
"""
from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "docs"
SRC = ROOT / "build" / "docs-src"
DOCTREES = ROOT / "build" / "docs-doctrees"
HTML = ROOT / "build" / "docs-out" / "html"   # myst-nb writes ../jupyter_execute beside it; moved to doc_path

_re_ansi = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_re_hide_line = re.compile(r"#\|\s*hide_line\s*$")
_re_magic = re.compile(r"^\s*%")
_re_directive = re.compile(r"^\s*#\s*\|")


def settings():
    from nbdev.config import get_config
    cfg = get_config(path=ROOT)
    return cfg


def page_name(nb: Path) -> str:
    "The page nbdev would make of this notebook: numeric prefix dropped, lower case (nbdev.doclinks._nbpath2html)."
    return re.sub(r"^\d+[a-zA-Z0-9]*_", "", nb.stem.lower())


def notebooks(nbs_path: Path) -> list[Path]:
    "Reading order: index first, then the notebooks in file-name order. Nothing is hard-coded."
    nbs = [p for p in nbs_path.rglob("*.ipynb")
           if not any(part.startswith(("_", ".")) for part in p.relative_to(nbs_path).parts)]
    nbs.sort(key=lambda p: (p.relative_to(nbs_path).as_posix() != "index.ipynb", p.relative_to(nbs_path).as_posix()))
    return nbs


def directives(source: str) -> tuple[dict, str]:
    "Leading `#|` lines of a code cell as nbdev reads them, and the code without them."
    from nbdev.process import _directive, first_code_ln
    lines = source.splitlines(True)
    first = first_code_ln(lines)
    if first is None: first = len(lines)
    dirs = dict(d for d in (_directive(s) for s in lines[:first]) if d)
    dirs = {k.rstrip(":"): v for k, v in dirs.items()}
    code = [ln for ln in lines[first:]]
    return dirs, "".join(code)


def defined_names(code: str) -> list[str]:
    "Names an exported cell defines, as nbdev's `_modidx` records them (classes also give `Class.method`)."
    try: tree = ast.parse(code)
    except SyntaxError: return []
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)): out.append(node.name)
        elif isinstance(node, ast.ClassDef):
            out.append(node.name)
            out += [f"{node.name}.{m.name}" for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name): out.append(n.id)
    return out


def process_notebook(src: Path, rel: str, cfg, modules: dict) -> tuple[nbformat.NotebookNode, dict]:
    nb = nbformat.read(src, as_version=4)
    info = {"notebook": rel, "page": page_name(src), "module": None, "title": None, "anchors": {}, "cuda_cells": 0}
    cells = []
    for cell in nb.cells:
        cell.metadata = {}
        cell.pop("attachments", None) if cell.cell_type == "code" else None
        if cell.cell_type == "markdown":
            if info["title"] is None:
                m = re.search(r"^#\s+(.+)$", cell.source, re.MULTILINE)
                if m: info["title"] = m.group(1).strip()
            cells.append(cell)
            continue
        if cell.cell_type != "code":
            continue
        dirs, code = directives(cell.source)
        if "default_exp" in dirs and dirs["default_exp"]: info["module"] = f"{cfg.lib_name}.{dirs['default_exp'][0]}"
        if "hide" in dirs: continue
        code = "\n".join(ln for ln in code.splitlines()
                         if not _re_hide_line.search(ln) and not _re_magic.match(ln)).strip("\n")
        meta = {"tags": [], "streamnb": {}}
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream": out["text"] = _re_ansi.sub("", out["text"])
            if "filter_stream" in dirs and out.get("output_type") == "stream" and dirs["filter_stream"]:
                pat = "|".join(dirs["filter_stream"])
                out["text"] = "".join(ln for ln in out["text"].splitlines(True) if not re.search(pat, ln))
        if dirs.get("echo", [""])[0].lower() == "false": meta["tags"].append("remove-input")
        if dirs.get("output", [""])[0].lower() == "false": meta["tags"].append("remove-output")
        if "cuda" in dirs:
            meta["tags"].append("gpu"); meta["streamnb"]["cuda"] = True; info["cuda_cells"] += 1
        if dirs.keys() & {"export", "exports", "exporti"}:
            names = defined_names(code)
            meta["streamnb"]["anchors"] = [n.lower() for n in names]
            for n in names: info["anchors"].setdefault(n, n.lower())
        if not code.strip() and not cell.get("outputs"): continue
        cell.source = code
        cell.metadata = meta
        cells.append(cell)
    # After the title cell: where the page comes from (the notebook) and the module it exports.
    git = f"{cfg.git_url}/blob/{cfg.branch}/{Path(cfg.nbs_path).relative_to(ROOT).as_posix()}/{rel}"
    line = f"Source notebook: [`{Path(cfg.nbs_path).name}/{rel}`]({git})"
    if info["module"] in modules:
        line += f" · exports {{py:mod}}`{info['module']}` (API reference: {{doc}}`api/{modules[info['module']]}`)"
    first_md = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"), -1)
    banner = nbformat.v4.new_markdown_cell(f"```{{container}} nb-source\n{line}\n```")
    banner.pop("id", None)
    cells.insert(first_md + 1, banner)
    nb.cells = cells
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    for i, c in enumerate(nb.cells): c["id"] = c.get("id") or f"streamnb-{i}"
    return nb, info


def api_page(mod: str, info: dict) -> str:
    "One page per module: every name of its `__all__`, in that order (autodoc skips undocumented data otherwise)."
    import importlib, inspect
    m = importlib.import_module(mod)
    title = f"{mod}"
    out = [title, "=" * len(title), "",
           f"Defined in the chapter :doc:`../{info['page']}` (notebook ``{info['notebook']}``).", "",
           f".. automodule:: {mod}", "   :no-members:", ""]
    for name in getattr(m, "__all__", []):
        obj = getattr(m, name, None)
        if inspect.isclass(obj):
            kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
            out += [f".. {kind}:: {mod}.{name}", "   :members:", "   :undoc-members:", "   :show-inheritance:", ""]
        elif inspect.isfunction(obj) or inspect.isbuiltin(obj):
            out += [f".. autofunction:: {mod}.{name}", ""]
        else:
            out += [f".. autodata:: {mod}.{name}", ""]
    return "\n".join(out)


def stage(cfg) -> dict:
    nbs_path = Path(cfg.nbs_path)
    shutil.rmtree(SRC, ignore_errors=True)
    (SRC / "api").mkdir(parents=True)
    nbs = notebooks(nbs_path)
    # First pass: which module each notebook exports (for the banner links).
    modules = {}
    for p in nbs:
        for cell in nbformat.read(p, as_version=4).cells:
            if cell.cell_type != "code": continue
            d, _ = directives(cell.source)
            if d.get("default_exp"): modules[f"{cfg.lib_name}.{d['default_exp'][0]}"] = d["default_exp"][0]; break
    pages, seen = [], {}
    for p in nbs:
        rel = p.relative_to(nbs_path).as_posix()
        nb, info = process_notebook(p, rel, cfg, modules)
        name = info["page"] if rel != "index.ipynb" else "index"
        if name in seen: sys.exit(f"docs: {rel} and {seen[name]} would both be {name}.html")
        seen[name] = rel
        info["page"] = name
        nbformat.write(nb, SRC / f"{name}.ipynb")
        pages.append(info)
    mods = [(i["module"], i) for i in pages if i["module"]]
    for mod, info in mods:
        (SRC / "api" / f"{modules[mod]}.rst").write_text(api_page(mod, info), encoding="utf-8")
    api_index = ["API reference", "=============", "",
                 f"Every public symbol of ``{cfg.lib_name}`` (each module's ``__all__``), module by module in "
                 "chapter order, with its signature, its docstring and a link to the notebook cell that defines it.", "",
                 ".. toctree::", "   :maxdepth: 1", ""]
    api_index += [f"   {mod} — {info['title']} <{modules[mod]}>" for mod, info in mods]
    (SRC / "api" / "index.rst").write_text("\n".join(api_index) + "\n", encoding="utf-8")
    # The sidebar: a hidden toctree appended to the index page, chapters in reading order, then the API.
    index = nbformat.read(SRC / "index.ipynb", as_version=4)
    toc = ["```{toctree}", ":hidden:", ":caption: Chapters", ":maxdepth: 1", ""]
    toc += [i["page"] for i in pages if i["page"] != "index"]
    toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Reference", "", "api/index", "```"]
    index.cells.append(nbformat.v4.new_markdown_cell("\n".join(toc)))
    index.cells[-1]["id"] = "streamnb-toc"
    nbformat.write(index, SRC / "index.ipynb")
    meta = {"pages": pages, "modules": modules, "git_url": cfg.git_url, "branch": cfg.branch,
            "nbs_dir": nbs_path.relative_to(ROOT).as_posix(), "title": cfg.title, "description": cfg.description,
            "author": cfg.author, "copyright": cfg.copyright, "lib_name": cfg.lib_name}
    (SRC / "_meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


def build(out: Path | None = None, quiet: bool = True) -> Path:
    cfg = settings()
    out = Path(out) if out else Path(cfg.doc_path)
    t0 = time.time()
    stage(cfg)
    os.environ["STREAMNB_DOCS_META"] = str(SRC / "_meta.json")
    os.environ.setdefault("MPLBACKEND", "Agg")
    for d in (out, DOCTREES, HTML.parent): shutil.rmtree(d, ignore_errors=True)
    from sphinx.cmd.build import build_main
    args = ["-b", "html", "-c", str(CONF_DIR), "-d", str(DOCTREES), "--keep-going", str(SRC), str(HTML)]
    if quiet: args.insert(0, "-q")
    rc = build_main(args)
    if rc: sys.exit(f"docs: sphinx-build failed (exit {rc})")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(HTML), str(out))
    (out / ".nojekyll").touch()
    print(f"docs: built {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}/ in {time.time() - t0:.1f} s; "
          f"open {out / 'index.html'} or run: python -m http.server -b 127.0.0.1 -d {out.name} 8000")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (default: settings.ini doc_path, _docs)")
    ap.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    a = ap.parse_args()
    build(a.out, quiet=not a.verbose)


if __name__ == "__main__":
    main()
