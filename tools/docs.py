"""Build the documentation site from the committed notebooks and their stored outputs: `python tools/docs.py`.

Nothing is executed. Sphinx (myst-nb with `nb_execution_mode = "off"`, the furo theme, autodoc) renders into
settings.ini's `doc_path` (`_docs/`); open `_docs/index.html`, or serve it: `python -m http.server -d _docs`.

What this script does before Sphinx runs, in `build/docs-src/` (the notebooks in nbs/ are never touched):
- the pages: `nbs/index.ipynb` first, then every other notebook in file-name order (names starting with `_` or `.`
  are skipped, as nbdev skips them), each named as nbdev names its page (`10_backward_streams.ipynb` ->
  `backward_streams.html`, so the links in `streamnb/_modidx.py` work on this site);
- nbdev's directives: `#| hide` cells are dropped, directive lines (`#| export`, `#| default_exp` ...) are removed,
  `#| hide_line` lines, `%` magics and ANSI escapes go, `#| echo: false` / `#| output: false` hide input / output,
  `#| code-fold: true` (an exercise's worked solution) shows the code collapsed in a <details> whose summary reads
  "Solution", its output below it (collapsed too when the cell's `metadata.jupyter.outputs_hidden` is set, as Jupyter
  collapses it),
  `#| filter_stream` filters, `#| cuda` cells get a "GPU cell" label (their outputs were recorded on a CUDA machine);
- every exported cell gets anchors named as nbdev names them (`#graphbuilder`, `#capture.module`);
- the API reference: one page per module of the package that has an `__all__` (found by walking the package, never
  a list kept here), every name of it with its signature and docstring (autodoc) and a link to the notebook cell that
  defines it;
- Markdown outputs (IPython `Markdown(...)`, e.g. the landing page's tables) are rendered as GitHub-flavoured
  Markdown (`render_markdown_format: gfm` in each page's metadata), so their tables are tables, not `|---|` text;
- figures: a stored plot is shown at up to its natural width (the content column widens to make room for it on a
  wide screen), and a click opens it full size (`_static/streamnb-site.css` / `.js`, written here).

The project's home. Where a repository link leads is set in `settings.ini`: `user` and `repo` (which make
`git_url`, `doc_host` and `doc_baseurl`), and `branch`. While `user` is the placeholder `example` (or `git_url` is
empty) the project has no public home, and no page links there: each chapter's banner offers its notebook as a
download from this site, the API entries link to their chapter's cell on this site (no [source] link), and there is
no "view source" button. Give the project a real home by setting `user` (and `repo`) in settings.ini: the banner,
the [source] links and the button then open the notebook on the repository (`git_url/blob/branch/nbs/...`).
Sphinx reads `docs/conf.py` through a small generated `build/docs-conf/conf.py` that applies this choice.

Sphinx's warnings are printed and saved to `build/docs-warnings.txt` (the site check fails on any).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import pkgutil
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
WARNINGS = ROOT / "build" / "docs-warnings.txt"
HTML = ROOT / "build" / "docs-out" / "html"   # myst-nb writes ../jupyter_execute beside it; moved to doc_path
GEN_CONF = ROOT / "build" / "docs-conf"        # docs/conf.py plus the choices made here (home, figures)
PLACEHOLDER_USERS = {"", "example", "user", "your-github-user"}


def project_home(cfg) -> str | None:
    "The project's repository (settings.ini `git_url`), or None while `user` is a placeholder: then nothing links there."
    url = (cfg.get("git_url") or "").strip()
    if not url or (cfg.get("user") or "").strip().lower() in PLACEHOLDER_USERS: return None
    return url

_re_ansi = re.compile(r"\x1B(?:[@-Z\\-_]|\[[0-?]*[ -/]*[@-~])")
_re_hide_line = re.compile(r"#\|\s*hide_line\s*$")
_re_magic = re.compile(r"^\s*[%!]")


def settings():
    from nbdev.config import get_config
    return get_config(path=ROOT)


def page_name(nb: Path, nbs_path: Path | None = None) -> str:
    "The page nbdev makes of a notebook (nbdev.doclinks._nbpath2html): folders kept, numeric prefix dropped, lower case."
    rel = nb.relative_to(nbs_path) if nbs_path else Path(nb.name)
    name = re.sub(r"^\d+[a-zA-Z0-9]*_", "", rel.stem.lower())
    return (rel.parent / name).as_posix()


def notebooks(nbs_path: Path) -> list[Path]:
    "Reading order: index first, then the notebooks in file-name order. Nothing is hard-coded."
    nbs = [p for p in Path(nbs_path).rglob("*.ipynb")
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
    return dirs, "".join(lines[first:])


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


SOLUTION = ("Solution", "Hide the solution")   # the summary of a collapsed cell, closed and open


def folded(dirs: dict) -> bool:
    "`#| code-fold: true` (Quarto's directive, which nbdev passes through): the cell's code starts collapsed."
    return [v.lower() for v in dirs.get("code-fold", [])] == ["true"]


def _export_target(dirs: dict, default: str | None) -> str | None:
    "The module an exported cell goes to: `#| export other` names it, else the notebook's `#| default_exp`."
    for k in ("export", "exports", "exporti"):
        if k in dirs: return dirs[k][0] if dirs[k] else default
    return None


def default_exp(nb) -> str | None:
    for cell in nb.cells:
        if cell.cell_type == "code":
            d, _ = directives(cell.source)
            if d.get("default_exp"): return d["default_exp"][0]
    return None


TEXT_PX = 736   # furo's text column (46em); a wider plot would be shrunk, its labels unreadable


def png_width(out) -> int:
    "The natural width in px of a stored PNG output (0 for any other output)."
    import base64, struct
    data = (out.get("data") or {}).get("image/png")
    if not data: return 0
    head = base64.b64decode("".join(data)[:64])
    return struct.unpack(">I", head[16:20])[0]


def figure_alt(code: str) -> str:
    "A figure's alt text: the titles its cell gives it (`title=`, `titles=[...]`), else the call that draws it."
    titles = [t for m in re.findall(r"""\btitles?\s*=\s*(\[[^\]]*\]|f?["'][^"']*["'])""", code)
              for t in re.findall(r"""["']([^"'{}]+)["']""", m)]
    if titles: return "figure: " + "; ".join(titles)
    calls = [ln.strip() for ln in code.splitlines() if re.search(r"\bplot\w*\(|\.(?:plot|imshow|bar)\(", ln)]
    return "figure drawn by " + (calls[0] if calls else code.strip().splitlines()[-1] if code.strip() else "this cell")[:150]


def process_notebook(src: Path, rel: str, page: str, cfg) -> tuple[nbformat.NotebookNode, dict]:
    nb = nbformat.read(src, as_version=4)
    dflt = default_exp(nb)
    info = {"notebook": rel, "page": page, "module": f"{cfg.lib_name}.{dflt}" if dflt else None, "title": None,
            "symbols": {}, "cuda_cells": 0}
    cells = []
    for cell in nb.cells:
        out_hidden = cell.get("metadata", {}).get("jupyter", {}).get("outputs_hidden") is True
        cell.metadata = {}
        if cell.cell_type == "markdown":
            if info["title"] is None:
                m = re.search(r"^#\s+(.+)$", cell.source, re.MULTILINE)
                if m: info["title"] = re.sub(r"[`*<>\\]", "", m.group(1)).strip()   # plain text: used in links
            cells.append(cell)
            continue
        if cell.cell_type != "code":
            continue
        cell.pop("attachments", None)
        dirs, code = directives(cell.source)
        if "hide" in dirs: continue
        code = "\n".join(ln for ln in code.splitlines()
                         if not _re_hide_line.search(ln) and not _re_magic.match(ln)).strip("\n")
        meta = {"tags": [], "streamnb": {}}
        for out in cell.get("outputs", []):
            if out.get("output_type") != "stream": continue
            out["text"] = _re_ansi.sub("", out["text"])
            if dirs.get("filter_stream"):
                pat = "|".join(dirs["filter_stream"])
                out["text"] = "".join(ln for ln in out["text"].splitlines(True) if not re.search(pat, ln))
        if dirs.get("echo", [""])[0].lower() == "false": meta["tags"].append("remove-input")
        if dirs.get("output", [""])[0].lower() == "false": meta["tags"].append("remove-output")
        if "cuda" in dirs:
            meta["tags"].append("gpu"); meta["streamnb"]["cuda"] = True; info["cuda_cells"] += 1
        if folded(dirs):   # a worked solution: its code collapsed under "Solution", its output shown
            meta["tags"].append("hide-input")
            meta["mystnb"] = {"code_prompt_show": SOLUTION[0], "code_prompt_hide": SOLUTION[1]}
            if out_hidden: meta["tags"].append("hide-output")   # an output that gives the answer away: collapsed too
        if any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):   # alt text: the figure's titles
            meta.setdefault("mystnb", {})["image"] = {"alt": figure_alt(code)}
        target = _export_target(dirs, dflt)
        if target:
            names = defined_names(code)
            meta["streamnb"]["anchors"] = [n.lower() for n in names]
            for n in names: info["symbols"].setdefault(f"{cfg.lib_name}.{target}.{n}", n.lower())
        if not code.strip() and not cell.get("outputs"): continue
        cell.source = code
        cell.metadata = meta
        cells.append(cell)
    info["title"] = info["title"] or page
    info["wide_plots"] = sum(png_width(o) > TEXT_PX for c in cells for o in c.get("outputs", []))
    nb.cells = cells
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"},
                   "mystnb": {"render_markdown_format": "gfm"}}   # Markdown(...) outputs: tables render as tables
    if info["wide_plots"]: nb.metadata["hide-toc"] = True   # the right-hand column is the plots' room (SITE_CSS)
    for i, c in enumerate(nb.cells): c["id"] = c.get("id") or f"streamnb-{i}"
    return nb, info


def public_modules(lib: str) -> dict[str, list[str]]:
    "Every module of the package (walked, not listed) with its `__all__`; the package itself if it has one."
    pkg = importlib.import_module(lib)
    found = {}
    mods = [lib] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, lib + ".")
                          if not any(p.startswith("_") for p in m.name.split(".")[1:]))
    for name in mods:
        try: m = importlib.import_module(name)
        except Exception as e: sys.exit(f"docs: cannot import {name} ({type(e).__name__}: {e})")
        names = list(getattr(m, "__all__", None) or [])
        if names: found[name] = names
    return found


def _locate(mod: str, name: str, symbols: dict) -> str | None:
    "The fully qualified name under which a public symbol was exported from a notebook (re-exports followed)."
    if f"{mod}.{name}" in symbols: return f"{mod}.{name}"
    obj = getattr(importlib.import_module(mod), name, None)
    home = getattr(obj, "__module__", None)
    if home and f"{home}.{name}" in symbols: return f"{home}.{name}"
    return None


def api_page(mod: str, names: list[str], chapter: dict | None, symbols: dict) -> str:
    "One page per module: every name of its `__all__`, in that order, autodoc'd (a re-export links to its home)."
    m = importlib.import_module(mod)
    out = [mod, "=" * len(mod), ""]
    if chapter:
        out += [f"Defined in the chapter :doc:`/{chapter['page']}` (notebook ``{chapter['notebook']}``).", ""]
    out += [f".. automodule:: {mod}", "   :no-members:", ""]
    for name in names:
        obj = getattr(m, name, None)
        home = _locate(mod, name, symbols)
        if home and home.rsplit(".", 1)[0] != mod:   # a re-export: one line, linking to the entry where it is defined
            s = symbols[home]
            out += [f".. py:data:: {mod}.{name}", "   :no-index-entry:", "",
                    f"   Re-exported from :py:obj:`{home}`.", "",
                    f"   *Defined in* `{s['title']} <../{s['page']}.html#{s['anchor']}>`__ (``{s['notebook']}``).", ""]
            continue
        if inspect.isclass(obj):
            kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
            out += [f".. {kind}:: {mod}.{name}", "   :members:", "   :undoc-members:", "   :show-inheritance:"]
            # a class split over cells takes part of its methods from private bases of ours: show those, not torch's
            ours = [b for b in obj.__mro__[1:] if b.__module__.startswith("streamnb.") and b.__name__.startswith("_")]
            foreign = dict.fromkeys(b.__name__ for b in obj.__mro__[1:] if not b.__module__.startswith("streamnb."))
            if ours: out += [f"   :inherited-members: {', '.join(foreign)}"]
            out += [""]
        elif callable(obj) and (inspect.isroutine(obj) or hasattr(obj, "__wrapped__")):
            out += [f".. autofunction:: {mod}.{name}", ""]
        else:
            out += [f".. autodata:: {mod}.{name}"]
            if len(repr(obj)) > 160: out += ["   :no-value:"]
            out += [""]
    return "\n".join(out)


def stage(cfg) -> dict:
    nbs_path = Path(cfg.nbs_path)
    shutil.rmtree(SRC, ignore_errors=True)
    (SRC / "api").mkdir(parents=True)
    pages, seen, symbols = [], {}, {}
    for p in notebooks(nbs_path):
        rel = p.relative_to(nbs_path).as_posix()
        name = "index" if rel == "index.ipynb" else page_name(p, nbs_path)
        if name in seen: sys.exit(f"docs: {rel} and {seen[name]} would both be {name}.html")
        seen[name] = rel
        nb, info = process_notebook(p, rel, name, cfg)
        (SRC / name).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, SRC / f"{name}.ipynb")
        for sym, anchor in info["symbols"].items():
            symbols.setdefault(sym, {"page": name, "anchor": anchor, "notebook": rel, "title": info["title"]})
        pages.append(info)
    # The API: every module with an __all__; its chapter: the notebook whose default_exp it is, else the one that
    # exports the most of its names.
    modules = {}
    public = public_modules(cfg.lib_name)
    for mod, names in public.items():   # re-exported names lead where their original leads
        for n in names:
            home = _locate(mod, n, symbols)
            if home and home != f"{mod}.{n}": symbols[f"{mod}.{n}"] = symbols[home]
    for mod, names in public.items():
        chapter = next((i for i in pages if i["module"] == mod), None)
        if chapter is None:
            counts = {}
            for n in names:
                s = symbols.get(_locate(mod, n, symbols) or "")
                if s: counts[s["page"]] = counts.get(s["page"], 0) + 1
            chapter = next((i for i in pages if counts and i["page"] == max(counts, key=counts.get)), None)
        short = mod.split(".", 1)[1] if "." in mod else mod
        modules[mod] = {"api": short, "names": names, "chapter": chapter["page"] if chapter else None,
                        "notebook": chapter["notebook"] if chapter else None,
                        "title": chapter["title"] if chapter else mod}
        (SRC / "api" / f"{short}.rst").write_text(api_page(mod, names, chapter, symbols), encoding="utf-8")
    order = {i["page"]: k for k, i in enumerate(pages)}
    api_mods = sorted(modules, key=lambda m: (modules[m]["chapter"] is not None,
                                              order.get(modules[m]["chapter"], len(order)), m))
    api_index = ["API reference", "=============", "",
                 f"Every public symbol of ``{cfg.lib_name}`` (each module's ``__all__``), module by module in "
                 "chapter order, with its signature, its docstring and a link to the notebook cell that defines it.", "",
                 ".. toctree::", "   :maxdepth: 1", ""]
    api_index += [f"   {m} — {modules[m]['title']} <{modules[m]['api']}>" for m in api_mods]
    (SRC / "api" / "index.rst").write_text("\n".join(api_index) + "\n", encoding="utf-8")
    # The banner under each chapter's title: its notebook, and the API page of the module it exports.
    api_of = {m["chapter"]: (mod, m["api"]) for mod, m in modules.items() if m["chapter"]}
    for info in pages:
        f = SRC / f"{info['page']}.ipynb"
        nb = nbformat.read(f, as_version=4)
        if project_home(cfg):
            git = f"{project_home(cfg)}/blob/{cfg.branch}/{nbs_path.relative_to(ROOT).as_posix()}/{info['notebook']}"
            line = f"Source notebook: [`{nbs_path.name}/{info['notebook']}`]({git})"
        else:   # no public home: the notebook itself, downloaded from this site
            rel = Path(os.path.relpath(nbs_path / info["notebook"], (SRC / info["page"]).parent)).as_posix()
            line = f"Source notebook: {{download}}`{nbs_path.name}/{info['notebook']} <{rel}>`"
        if info["page"] in api_of:
            mod, short = api_of[info["page"]]
            line += f" · exports `{mod}` (API reference: {{doc}}`/api/{short}`)"
        first_md = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"), -1)
        banner = nbformat.v4.new_markdown_cell(f"```{{container}} nb-source\n{line}\n```")
        banner["id"] = "streamnb-source"
        nb.cells.insert(first_md + 1, banner)
        if info["page"] == "index":
            # The sidebar: a hidden toctree on the index page, chapters in reading order, then the API.
            toc = ["```{toctree}", ":hidden:", ":caption: Chapters", ":maxdepth: 1", ""]
            toc += [i["page"] for i in pages if i["page"] != "index"]
            toc += ["```", "", "```{toctree}", ":hidden:", ":caption: Reference", "", "api/index", "```"]
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(toc)))
            nb.cells[-1]["id"] = "streamnb-toc"
        nbformat.write(nb, f)
    meta = {"pages": pages, "modules": modules, "symbols": symbols, "git_url": project_home(cfg) or "", "home": project_home(cfg), "branch": cfg.branch,
            "nbs_dir": nbs_path.relative_to(ROOT).as_posix(), "title": cfg.title, "description": cfg.description,
            "author": cfg.author, "copyright": cfg.copyright, "lib_name": cfg.lib_name}
    (SRC / "_meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return meta


SITE_CSS = """/* written by tools/docs.py: figures readable at their displayed size */
.cell_output img { max-width: 100%; height: auto; cursor: zoom-in; }
/* On a wide screen a plot wider than the text column takes up to its natural width, into the right-hand column
   (pages with such plots carry furo's hide-toc, so nothing sits there). */
@media (min-width: 67em) {
  .cell_output img.streamnb-wide { max-width: min(var(--natural-width, 100%), calc(100vw - max(15em, 50vw - 26em) - 6em)); }
}
/* outputs wrap: a grade's line is read whole, not cut at the column's edge */
.cell_output pre { white-space: pre-wrap; overflow-wrap: anywhere; }
/* tables stay within the page: their cells wrap, and a table still too wide scrolls inside itself */
article table { display: block; max-width: 100%; overflow-x: auto; }
article table td, article table th { overflow-wrap: anywhere; }
.streamnb-zoom { position: fixed; inset: 0; z-index: 1000; background: rgba(0,0,0,.8); display: flex;
  align-items: center; justify-content: center; cursor: zoom-out; }
.streamnb-zoom img { max-width: 98vw; max-height: 98vh; background: white; }
"""
SITE_JS = """// written by tools/docs.py: a plot wider than the text column grows to its natural width; a click enlarges it
document.addEventListener('DOMContentLoaded', () => {
  document.querySelectorAll('.cell_output img').forEach(img => {
    const widen = () => { if (img.naturalWidth > img.parentElement.clientWidth) {
      // as wide as its natural width, the room left of the window's edge allows (never a sideways scroll)
      const room = document.documentElement.clientWidth - img.parentElement.getBoundingClientRect().left - 16;
      img.style.setProperty('--natural-width', Math.min(img.naturalWidth, room) + 'px');
      img.classList.add('streamnb-wide'); } };
    if (img.complete) widen(); else img.addEventListener('load', widen);
    window.addEventListener('resize', () => { img.classList.remove('streamnb-wide'); widen(); });
    img.title = img.title || 'click to enlarge';
    img.addEventListener('click', () => {
      const box = document.createElement('div'); box.className = 'streamnb-zoom';
      const big = document.createElement('img'); big.src = img.src; big.alt = img.alt; box.appendChild(big);
      box.addEventListener('click', () => box.remove()); document.body.appendChild(box);
    });
  });
});
"""


def write_conf(home_url: str | None) -> Path:
    "build/docs-conf/conf.py: docs/conf.py, then the links the project's home allows and the figure assets."
    static = GEN_CONF / "_static"
    shutil.rmtree(GEN_CONF, ignore_errors=True)
    static.mkdir(parents=True)
    (static / "streamnb-site.css").write_text(SITE_CSS, encoding="utf-8")
    (static / "streamnb-site.js").write_text(SITE_JS, encoding="utf-8")
    conf = CONF_DIR / "conf.py"
    text = [f"# Generated by tools/docs.py: {conf.relative_to(ROOT)}, then the choices below. Do not edit.",
            "from pathlib import Path as _Path",
            f"__file__ = {str(conf)!r}",
            f"exec(compile(_Path(__file__).read_text(encoding='utf-8'), __file__, 'exec'))",
            f"html_static_path = list(html_static_path) + [{str(static)!r}]",
            "html_css_files = list(html_css_files) + ['streamnb-site.css']",
            "html_js_files = list(globals().get('html_js_files', [])) + ['streamnb-site.js']"]
    if not home_url:   # settings.ini names no real home: no [source] links, no 'view source' button
        text += ["extensions = [e for e in extensions if e != 'sphinx.ext.linkcode']",
                 "html_theme_options = {**html_theme_options, 'top_of_page_buttons': [], 'source_repository': ''}"]
    (GEN_CONF / "conf.py").write_text("\n".join(text) + "\n", encoding="utf-8")
    return GEN_CONF


def build(out: Path | None = None, quiet: bool = True) -> Path:
    cfg = settings()
    out = Path(out) if out else Path(cfg.doc_path)
    t0 = time.time()
    sys.path.insert(0, str(ROOT))   # the package of this checkout, installed or not
    os.environ.setdefault("MPLBACKEND", "Agg")
    stage(cfg)
    os.environ["STREAMNB_DOCS_META"] = str(SRC / "_meta.json")
    for d in (out, DOCTREES, HTML.parent): shutil.rmtree(d, ignore_errors=True)
    from sphinx.cmd.build import build_main
    write_conf(project_home(cfg))
    args = ["-b", "html", "-c", str(GEN_CONF), "-d", str(DOCTREES), "-w", str(WARNINGS), "--keep-going",
            str(SRC), str(HTML)]
    if quiet: args.insert(0, "-q")
    rc = build_main(args)
    if rc: sys.exit(f"docs: sphinx-build failed (exit {rc}); warnings in {WARNINGS}")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(HTML), str(out))
    (out / ".nojekyll").touch()
    n_warn = sum(1 for ln in WARNINGS.read_text().splitlines() if "WARNING" in ln or "ERROR" in ln)
    shown = out.relative_to(ROOT) if out.is_relative_to(ROOT) else out
    print(f"docs: built {shown}/ in {time.time() - t0:.1f} s, {n_warn} warnings"
          f"{f' (listed in {WARNINGS.relative_to(ROOT)})' if n_warn else ''}; open {out / 'index.html'} "
          f"or run: python -m http.server -b 127.0.0.1 -d {shown} 8000")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="output folder (default: settings.ini doc_path, _docs)")
    ap.add_argument("--verbose", action="store_true", help="show Sphinx's progress")
    a = ap.parse_args()
    build(a.out, quiet=not a.verbose)


if __name__ == "__main__":
    main()
