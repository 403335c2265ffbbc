"""Sphinx configuration for the streamnb site. Run through `python tools/docs.py`, which stages the notebooks
(nbdev directives applied) into build/docs-src/ and points STREAMNB_DOCS_META at its _meta.json: the pages, the
modules with their chapters, and every exported symbol with the notebook cell that defines it."""
import json
import os
import posixpath
import re
import sys
from pathlib import Path

from docutils import nodes

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
META = json.loads(Path(os.environ.get("STREAMNB_DOCS_META", ROOT / "build/docs-src/_meta.json")).read_text())
PAGES = {p["page"]: p for p in META["pages"]}
MODULES = META["modules"]
SYMBOLS = META["symbols"]

project = META["title"]
author = META["author"]
copyright = META["copyright"]
extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.linkcode"]
exclude_patterns = ["_meta.json", "**/.ipynb_checkpoints"]
templates_path = []
html_static_path = [str(Path(__file__).parent / "_static")]
html_css_files = ["streamnb.css"]
html_favicon = str(Path(__file__).parent / "_static" / "favicon.svg")  # else Chromium asks for /favicon.ico: a 404
html_theme = "furo"
html_title = META["title"]
html_copy_source = False
html_show_sourcelink = False
html_theme_options = {"top_of_page_buttons": ["view"], "source_repository": META["git_url"] + "/",
                      "source_branch": META["branch"], "source_directory": META["nbs_dir"] + "/"}
default_role = "literal"          # `name` in docstrings reads as code, as it does in the notebooks
nb_execution_mode = "off"         # the stored outputs, never re-run
nb_merge_streams = True
myst_enable_extensions = ["colon_fence"]
autodoc_default_options = {"members": True, "undoc-members": True, "member-order": "bysource"}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_inherit_docstrings = False   # torch's own docstrings (Interpreter.run ...) are not streamnb's API
# Outputs of types no page can show (widget state ...) are dropped silently; nothing else is suppressed.
suppress_warnings = ["mystnb.unknown_mime_type"]


def symbol(fullname: str):
    "Where `streamnb.mod.Name` (or `...Name.method`) is defined: its page, cell anchor and notebook; else None."
    parts = fullname.split(".")
    for k in range(len(parts), 1, -1):
        s = SYMBOLS.get(".".join(parts[:k]))
        if s: return s
    return None


def notebook_url(notebook: str) -> str:
    return f"{META['git_url']}/blob/{META['branch']}/{META['nbs_dir']}/{notebook}"


def linkcode_resolve(domain, info):
    "The [source] link of every API entry: the notebook that defines it, never the generated module."
    if domain != "py": return None
    s = symbol(f"{info.get('module', '')}.{info.get('fullname', '')}")
    if s: return notebook_url(s["notebook"])
    mod = MODULES.get(info.get("module", ""))
    return notebook_url(mod["notebook"]) if mod and mod["notebook"] else None


_re_tick = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _md_to_rst(lines):
    "nbdev docstrings are Markdown: `x`s and `x` next to letters would be broken reST; make them literals."
    text = "\n".join(lines)
    text = _re_tick.sub(lambda m: f"\\ ``{m.group(1)}``\\ ", text)
    text = re.sub(r"(?<![\w*])\*(?=\w)(?![^*\n]*\*)", r"\\*", text)   # a lone *args
    lines[:] = text.split("\n")


_MEMBER = ("method", "attribute", "property", "classmethod", "staticmethod")


def _defined_in(app, what, name, obj, options, lines):
    "Each API entry (and each exported method) ends with a link to the notebook cell that defines it."
    if what == "data" and getattr(obj, "__doc__", None) == getattr(type(obj), "__doc__", None):
        lines.clear()   # a dict or tuple constant: not the docstring of `dict`
    _md_to_rst(lines)
    s = SYMBOLS.get(name)
    if s is None and what not in _MEMBER:
        s = symbol(name)
    if s is None: return
    docname = app.env.docname if app.env else "api/index"
    href = posixpath.relpath(s["page"], posixpath.dirname(docname)) + ".html#" + s["anchor"]
    lines += ["", f"*Defined in* `{s['title']} <{href}>`__ (``{s['notebook']}``)."]


def _cell_ids(app, doctree):
    "Anchors on exported cells (as nbdev's _modidx names them) and a visible label on #| cuda cells."
    seen = set(doctree.ids)
    for node in list(doctree.findall(nodes.container)):
        if node.get("nb_element") != "cell_code": continue
        md = (node.get("cell_metadata") or {}).get("streamnb", {})
        for a in md.get("anchors", []):
            if a not in seen: node["ids"].append(a); seen.add(a)
        if md.get("cuda"):
            label = nodes.paragraph(classes=["gpu-label"])
            label += nodes.strong(text="GPU cell")
            label += nodes.Text(" (#| cuda): runs only on a CUDA device, nbdev_test skips it; the output shown is the "
                                "one stored in the notebook.")
            node.insert(0, label)


def _page_context(app, pagename, templatename, context, doctree):
    "The 'view source' button of a chapter opens its notebook in nbs/; pages made here (API) get none."
    page = PAGES.get(pagename)
    if page:
        context["theme_source_view_link"] = notebook_url(page["notebook"])
    else:
        context["theme_source_repository"] = ""; context["theme_source_view_link"] = ""


def setup(app):
    app.connect("autodoc-process-docstring", _defined_in)
    app.connect("doctree-read", _cell_ids)
    app.connect("html-page-context", _page_context)
