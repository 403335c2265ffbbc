"""The documentation site, checked in a real browser (headless Chromium from Debian, driven by Playwright).

Builds the site (`tools/docs.py`, into settings.ini's doc_path, `_docs/`), serves it on 127.0.0.1 and visits every
page. Fails on: a console error, page error, failed request or HTTP error; an image that did not decode
(`naturalWidth == 0`); an internal link or #anchor that does not resolve; an empty page; a chapter missing from the
sidebar (or out of reading order); a public symbol (any module's `__all__`) without an API entry, signature, docstring,
link to its chapter or (once settings.ini names a real home) a [source] link to its notebook; raw Markdown table
text (`|---|`) on a page, or a table of a notebook's Markdown output that is not an HTML table on its page; a link to
the placeholder home (`github.com/example`); a figure whose smallest text is under 8 px as displayed (1440 and 1280 px
wide windows), or a plot that a click does not enlarge; nbdev directives not honoured; a search that finds nothing;
a Sphinx warning; a build slower than 2 minutes. What it expects is read from the notebooks and the package at test
time, never from a list kept here. Saves screenshots of the index page and of one chapter (its top, and its first
plot) in `_docs/_check/`.

Not part of the quick run: it runs when STREAMNB_SITE=1 (`.ci/run` sets it). Then a missing browser is a failure,
never a skip: `apt-get install -y chromium` and `pip install -e ".[dev]"` (playwright) bring what it needs.
"""
import functools
import http.server
import importlib
import inspect
import json
import os
import pkgutil
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENABLED = os.environ.get("STREAMNB_SITE") == "1"
pytestmark = pytest.mark.skipif(not ENABLED, reason="browser check of the docs site: "
                                                    "STREAMNB_SITE=1 pytest tests/test_site.py (CI runs it)")
CHROMIUM = os.environ.get("STREAMNB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
_re_dir = re.compile(r"^\s*#\s*\|\s*([\w-]+):?\s*(.*)$")


# --- what the site must show, read from the notebooks and the package (independently of tools/docs.py) ---

_SNAPSHOT = {}   # the notebooks as they were when the site was built (others may be editing them meanwhile)
_CHAPTERS = []


def _cfg():
    from nbdev.config import get_config
    return get_config(path=ROOT)


def chapter_notebooks():
    "Notebooks in reading order (file-name order, `_`/`.` names skipped as nbdev skips them), index excluded."
    if _CHAPTERS: return _CHAPTERS[0]
    nbs = Path(_cfg().nbs_path)
    found = [p for p in nbs.rglob("*.ipynb") if not any(s.startswith(("_", ".")) for s in p.relative_to(nbs).parts)]
    return nbs, sorted((p for p in found if p.relative_to(nbs).as_posix() != "index.ipynb"),
                       key=lambda p: p.relative_to(nbs).as_posix())


def html_of(nb: Path, nbs: Path) -> str:
    "nbdev's page name: folders kept, numeric prefix dropped, lower case."
    rel = nb.relative_to(nbs)
    return (rel.parent / (re.sub(r"^\d+[a-zA-Z0-9]*_", "", rel.stem.lower()) + ".html")).as_posix()


def read_nb(p: Path):
    import nbformat
    text = _SNAPSHOT.get(Path(p).resolve()) or Path(p).read_text(encoding="utf-8")
    return nbformat.reads(text, as_version=4)


def shown_code(nb_path: Path):
    "The code cells a reader must see, as they read in the notebook without nbdev's directive lines; and # of cuda cells."
    shown, cuda = [], 0
    for c in read_nb(nb_path).cells:
        if c.cell_type != "code": continue
        lines = c.source.splitlines()
        head = [m for m in (_re_dir.match(l) for l in lines) if m]
        dirs = {m.group(1): m.group(2).strip().lower() for m in head}
        if "hide" in dirs: continue
        cuda += "cuda" in dirs
        if dirs.get("echo") == "false": continue
        code = [l for l in lines if not _re_dir.match(l) and not l.lstrip().startswith(("%", "!"))
                and not re.search(r"#\|\s*hide_line\s*$", l)]
        text = _norm("\n".join(code))
        if text: shown.append(text)
    return shown, cuda


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def public_api():
    "{module: __all__} for every module of the package that has one (walked, like tools/docs.py, but here)."
    lib = _cfg().lib_name
    sys.path.insert(0, str(ROOT))
    pkg = importlib.import_module(lib)
    mods = [lib] + [m.name for m in pkgutil.walk_packages(pkg.__path__, lib + ".")
                    if not any(p.startswith("_") for p in m.name.split(".")[1:])]
    return {m: list(importlib.import_module(m).__all__) for m in mods
            if getattr(importlib.import_module(m), "__all__", None)}


# --- the site, a server, the browser ---

def _docs_module():
    "tools/docs.py, loaded from its file (a plain `import docs` could find the docs/ folder instead)."
    import importlib.util
    spec = importlib.util.spec_from_file_location("streamnb_docs_tool", ROOT / "tools" / "docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def site():
    docs = _docs_module()
    nbs, chapters = chapter_notebooks()
    _CHAPTERS[:] = [(nbs, chapters)]
    _SNAPSHOT.update({p.resolve(): p.read_text(encoding="utf-8") for p in chapters + [nbs / "index.ipynb"]})
    t0 = time.time()
    out = docs.build()
    build_s = time.time() - t0
    print(f"\nsite build: {build_s:.1f} s")
    meta = json.loads((docs.SRC / "_meta.json").read_text())
    return {"out": out, "meta": meta, "build_s": build_s, "warnings": docs.WARNINGS.read_text()}


@pytest.fixture(scope="module")
def server(site):
    handler = functools.partial(_QuietHandler, directory=str(site["out"]))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


def _chromium_problem():
    if not Path(CHROMIUM).exists():
        return (f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium (the browser check fails "
                "without it; it never skips when STREAMNB_SITE=1)")
    try: import playwright.sync_api  # noqa: F401  (a dev requirement)
    except ImportError as e: return f"playwright is not installed ({e}): pip install -e '.[dev]' -c constraints.txt"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    problem = _chromium_problem()
    if problem: pytest.fail(problem)
    from playwright.sync_api import sync_playwright
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                   args=FLAGS, viewport={"width": 1440, "height": 900})
        yield ctx
        ctx.close()


_PAGE_JS = """() => {
  const main = document.querySelector('article[role=main]') || document.body;
  const api = Array.from(document.querySelectorAll('dl.py > dt[id]')).map(dt => {
    const dd = dt.nextElementSibling;
    const paras = dd ? Array.from(dd.children).filter(p => p.tagName === 'P') : [];
    const def = paras.filter(p => p.textContent.trim().startsWith('Defined in'));
    return {id: dt.id, sig: dt.textContent, body: dd ? dd.textContent : '',
            defined: def.map(p => (p.querySelector('a') || {getAttribute: () => null}).getAttribute('href')),
            source: Array.from(dt.querySelectorAll('a')).filter(a => a.textContent.includes('[source]'))
                         .map(a => a.getAttribute('href'))};
  });
  return {
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id)
           .concat(Array.from(document.querySelectorAll('a[name]')).map(e => e.name)),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
    images: Array.from(document.images).map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
    plots: main.querySelectorAll('.cell_output img').length,
    tables: main.querySelectorAll('.cell_output table').length,
    figs: Array.from(main.querySelectorAll('.cell_output img')).map(i => ({src: i.getAttribute('src'),
            natural: i.naturalWidth, shown: i.getBoundingClientRect().width})),
    body: main.innerText,
    prose: (() => { const c = main.cloneNode(true);   // the page's text outside code blocks
                    c.querySelectorAll('pre, code, .highlight').forEach(e => e.remove()); return c.textContent; })(),
    text: main.innerText.trim().length,
    sidebar: Array.from(document.querySelectorAll('.sidebar-tree a.reference')).map(a => a.getAttribute('href')),
    code: Array.from(main.querySelectorAll('.cell_input pre')).map(p => p.textContent),
    gpu: main.querySelectorAll('.gpu-label').length,
    folded: Array.from(main.querySelectorAll('details')).filter(d => d.querySelector('.cell_input pre')).map(d => ({
      open: d.open, summary: (d.querySelector('summary .collapsed') || d.querySelector('summary')).textContent.trim(),
      visible: d.querySelector('.cell_input pre').checkVisibility(),   // false inside a closed <details>
      code: d.querySelector('.cell_input pre').textContent})),
    api: api,
  };
}"""


@pytest.fixture(scope="module")
def crawl(site, server, browser):
    "Visit every built page once; what the browser saw, by page path."
    out = site["out"]
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")
                   if not any(s.startswith(("_", ".")) for s in p.relative_to(out).parts))
    seen, problems, t0 = {}, [], time.time()
    page = browser.new_page()
    page.on("console", lambda m: m.type == "error" and problems.append(f"{page.url}: console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{page.url}: page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"{page.url}: request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{page.url}: HTTP {r.status}: {r.url}"))
    for rel in pages:
        page.goto(server + quote(rel), wait_until="load")
        page.wait_for_load_state("networkidle")
        # images lazy-loaded or below the fold: bring each into view before asking whether it decoded
        page.evaluate("() => Promise.all(Array.from(document.images).map(i => { i.loading = 'eager'; "
                      "return i.decode().catch(() => null); }))")
        seen[rel] = page.evaluate(_PAGE_JS)
        if rel == "index.html": shot(page, out, "index.png")
    # The chapter shown: the one with the most plots (ties: reading order).
    nbs, chapters = chapter_notebooks()
    best = max(chapters, key=lambda p: (seen.get(html_of(p, nbs), {}).get("plots", 0), -chapters.index(p)))
    chapter = html_of(best, nbs)
    page.goto(server + quote(chapter), wait_until="networkidle")
    shot(page, out, "chapter.png")
    if seen[chapter]["plots"]:
        page.locator("article .cell_output img").first.scroll_into_view_if_needed()
        shot(page, out, "chapter-plot.png")
    zoom = None
    if seen[chapter]["plots"]:   # click to enlarge: the plot opens on top of the page, as large as the window allows
        img = page.locator("article .cell_output img").first
        img.click()
        page.wait_for_timeout(200)
        zoom = page.evaluate("() => { const b = document.querySelector('.streamnb-zoom img'); const i = "
                             "document.querySelector('article .cell_output img'); return b && {shown: "
                             "b.getBoundingClientRect().width, natural: i.naturalWidth, window: window.innerWidth}; }")
        if zoom: shot(page, out, "chapter-zoom.png"); page.locator(".streamnb-zoom").click()
    api = page.evaluate("() => { const a = document.querySelector('.nb-source a[href*=\"api/\"]'); "
                        "return a && a.getAttribute('href'); }")
    if api:   # the API page the chapter's banner links to
        page.goto(server + quote(_resolve(chapter, api)[0]), wait_until="networkidle")
        shot(page, out, "api.png")
    page.close()
    print(f"browser check: {len(pages)} pages in {time.time() - t0:.1f} s; chapter shown: {chapter}; "
          f"screenshots in {out / '_check'}")
    return {"pages": seen, "problems": problems, "chapter": chapter, "zoom": zoom}


def shot(page, out, name):
    (out / "_check").mkdir(exist_ok=True)
    page.screenshot(path=str(out / "_check" / name), full_page=False)


def _resolve(rel, href):
    "Internal link -> (target page path, fragment), or None for an external one."
    if href is None: return None
    u = urlparse(href)
    if u.scheme or u.netloc or href.startswith(("mailto:", "javascript:")): return None
    target = urljoin("http://x/" + rel, u.path).removeprefix("http://x/") if u.path else rel
    target = unquote(target)
    if target.endswith("/") or target == "": target += "index.html"
    return target, unquote(u.fragment)


# --- the checks ---

def test_chromium_and_playwright_available():
    assert _chromium_problem() is None, _chromium_problem()


def test_build_is_fast_and_clean(site):
    assert site["build_s"] < 120, f"building the site took {site['build_s']:.0f} s (the budget is 2 minutes)"
    assert not site["warnings"].strip(), f"Sphinx warnings:\n{site['warnings'][:4000]}"


def test_no_console_errors_or_failed_requests(crawl):
    assert not crawl["problems"], "\n".join(crawl["problems"][:30])


def test_every_page_has_content(crawl):
    empty = [rel for rel, p in crawl["pages"].items() if p["text"] < 40 and rel != "search.html"]
    assert not empty, f"empty pages: {empty}"


def test_images_decode(crawl):
    bad = [(rel, i["src"]) for rel, p in crawl["pages"].items() for i in p["images"] if not i["ok"]]
    assert not bad, f"images that did not decode (naturalWidth == 0): {bad}"


def test_every_stored_plot_is_shown(crawl):
    "Each chapter shows as many images as its notebook's visible cells have image outputs."
    nbs, chapters = chapter_notebooks()
    wrong = []
    for p in chapters + [nbs / "index.ipynb"]:
        want = 0
        for c in read_nb(p).cells:
            dirs = {m.group(1): m.group(2).strip().lower() for m in map(_re_dir.match, c.source.splitlines()) if m}
            if c.cell_type != "code" or "hide" in dirs or dirs.get("output") == "false": continue
            want += sum(1 for o in c.get("outputs", []) if any(k.startswith("image/") for k in o.get("data", {})))
        got = crawl["pages"][html_of(p, nbs) if p.name != "index.ipynb" else "index.html"]["plots"]
        if got != want: wrong.append(f"{p.name}: {got} images shown, {want} stored")
    assert not wrong, wrong


def test_internal_links_and_anchors_resolve(site, crawl):
    out, bad = site["out"], []
    for rel, p in crawl["pages"].items():
        for href in p["links"]:
            r = _resolve(rel, href)
            if r is None: continue
            target, frag = r
            if not (out / target).is_file(): bad.append(f"{rel}: {href} -> no file {target}"); continue
            if frag and target in crawl["pages"] and frag not in crawl["pages"][target]["ids"]:
                bad.append(f"{rel}: {href} -> no #{frag} in {target}")
    assert not bad, f"{len(bad)} broken internal links:\n" + "\n".join(bad[:40])


def test_sidebar_lists_every_chapter_in_reading_order(crawl):
    nbs, chapters = chapter_notebooks()
    expected = [html_of(p, nbs) for p in chapters]
    assert len(expected) >= 2
    for rel, p in crawl["pages"].items():
        got = [r[0] for r in (_resolve(rel, h) for h in p["sidebar"]) if r]
        listed = [g for g in got if g in expected]
        missing = [e for e in expected if e not in listed]
        assert not missing, f"{rel}: chapters missing from the sidebar: {missing}"
        assert listed == expected, f"{rel}: sidebar order {listed} != reading order {expected}"
        assert "api/index.html" in got, f"{rel}: no API reference in the sidebar"


def test_every_chapter_shows_its_code_as_in_the_notebook(crawl):
    "#| hide cells are not shown, directive lines are not shown, every other code cell is, in order; #| cuda marked."
    nbs, chapters = chapter_notebooks()
    for p in chapters + [nbs / "index.ipynb"]:
        page = crawl["pages"][html_of(p, nbs) if p.name != "index.ipynb" else "index.html"]
        want, cuda = shown_code(p)
        got = [_norm(c) for c in page["code"]]
        assert got == want, (f"{p.name}: code shown differs from the notebook's visible cells; first difference: "
                             f"{next(((g, w) for g, w in zip(got, want) if g != w), (len(got), len(want)))}")
        assert page["gpu"] == cuda, f"{p.name}: {page['gpu']} GPU labels for {cuda} #| cuda cells"


def folded_code(nb_path: Path):
    "The code of the cells whose first lines say `#| code-fold: true` (worked solutions), directive lines dropped."
    out = []
    for c in read_nb(nb_path).cells:
        if c.cell_type != "code": continue
        lines = c.source.splitlines()
        dirs = {m.group(1): m.group(2).strip().lower() for m in (_re_dir.match(l) for l in lines) if m}
        if "hide" in dirs or dirs.get("code-fold") != "true": continue
        out.append(_norm("\n".join(l for l in lines if not _re_dir.match(l))))
    return out


def test_solution_cells_render_collapsed(crawl):
    "A `#| code-fold: true` cell (an exercise's worked solution) shows its code in a closed <details> whose summary "
    "reads Solution, without the directive line; its code is hidden until opened."
    nbs, chapters = chapter_notebooks()
    total = 0
    for p in chapters + [nbs / "index.ipynb"]:
        page = crawl["pages"][html_of(p, nbs) if p.name != "index.ipynb" else "index.html"]
        want = folded_code(p)
        total += len(want)
        got = page["folded"]
        assert [_norm(f["code"]) for f in got] == want, f"{p.name}: collapsed cells {got} != solution cells {want}"
        for f in got:
            assert not f["open"] and f["summary"] == "Solution" and not f["visible"], f"{p.name}: {f}"
            assert "code-fold" not in f["code"], f"{p.name}: the directive line is shown: {f['code'][:80]}"
    assert total, "no notebook has a #| code-fold: true cell: nothing checked"


def _docfirst(obj):
    doc = inspect.getdoc(obj) if (inspect.isroutine(obj) or inspect.isclass(obj)) and obj.__doc__ else None
    return re.sub(r"\W+", "", doc.strip().split("\n\n")[0])[:60] if doc else None


def test_api_reference_covers_every_public_symbol(site, crawl):
    "Every name of every module's __all__: an entry with its signature, its docstring, a link to the cell of the "
    "chapter that defines it, and a [source] link to that chapter's notebook (never to the generated .py)."
    nbs, chapters = chapter_notebooks()
    page_of_nb = {p.relative_to(nbs).as_posix(): html_of(p, nbs) for p in chapters}
    cfg = _cfg()
    nb_url = f"{cfg.git_url}/blob/{cfg.branch}/{Path(cfg.nbs_path).relative_to(ROOT).as_posix()}/"
    entries = {e["id"]: (rel, e) for rel, p in crawl["pages"].items() if rel.startswith("api/") for e in p["api"]}
    problems = []
    api = public_api()
    assert api, "no module with an __all__ found"
    for mod, names in api.items():
        m = importlib.import_module(mod)
        for name in names:
            sym, obj = f"{mod}.{name}", getattr(m, name, None)
            if sym not in entries: problems.append(f"{sym}: no API entry"); continue
            rel, e = entries[sym]
            try: params = inspect.signature(obj).parameters if callable(obj) else {}
            except (TypeError, ValueError): params = {}
            if (inspect.isroutine(obj) or params) and "(" not in e["sig"]: problems.append(f"{sym}: no signature")
            first = _docfirst(obj)
            if first and first not in re.sub(r"\W+", "", e["body"]): problems.append(f"{sym}: docstring not shown")
            chapter = [r for r in (_resolve(rel, h) for h in e["defined"]) if r and r[0] in page_of_nb.values()]
            if not chapter: problems.append(f"{sym}: no link to its chapter ({e['defined']})"); continue
            target, frag = chapter[0]
            if not frag or frag not in crawl["pages"][target]["ids"]:
                problems.append(f"{sym}: its chapter link {target}#{frag} has no such cell")
            if not home_url():   # no public home: no [source] link at all (the chapter link above is the source)
                if e["source"]: problems.append(f"{sym}: [source] {e['source']} leads to a placeholder home")
                continue
            src = [h for h in e["source"] if "/blob/" in h]
            if not src or not all(h.endswith(".ipynb") for h in src):
                problems.append(f"{sym}: [source] {e['source']} is not a notebook link")
            elif page_of_nb.get(src[0].removeprefix(nb_url)) != target:
                problems.append(f"{sym}: [source] {src[0]} is not the notebook of {target}")
    assert not problems, f"{len(problems)} API problems:\n" + "\n".join(problems[:40])
    py_links = [h for p in crawl["pages"].values() for h in p["links"] if "/blob/" in h and h.endswith(".py")]
    assert not py_links, f"source links to generated modules: {py_links[:5]}"


PLACEHOLDER_USERS = {"", "example", "user", "your-github-user"}


def home_url():
    "settings.ini's git_url, or None while its `user` is a placeholder (then no page may link there)."
    cfg = _cfg()
    return None if (cfg.get("user") or "").strip().lower() in PLACEHOLDER_USERS else cfg.git_url


_re_raw_table = re.compile(r"\|\s*:?(?:-{3,}|[—–][-—–]*):?\s*\|")   # |---| (or |—|: dashes made typographic)


def markdown_tables(nb_path: Path) -> int:
    "How many tables the notebook's shown Markdown outputs (IPython `Markdown(...)`) hold."
    n = 0
    for c in read_nb(nb_path).cells:
        dirs = {m.group(1): m.group(2).strip().lower() for m in map(_re_dir.match, c.source.splitlines()) if m}
        if c.cell_type != "code" or "hide" in dirs or dirs.get("output") == "false": continue
        for o in c.get("outputs", []):
            md = (o.get("data") or {}).get("text/markdown", "")
            n += len(re.findall(r"^\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)+\|?\s*$", "".join(md), re.M))
    return n


def test_markdown_tables_render_as_tables(crawl):
    "No page shows a Markdown table as text (`|---|`, or `|—|` once the dashes are made typographic, outside code "
    "blocks), and every table of a notebook's Markdown outputs (the landing page's) is an HTML table on its page."
    raw = [f"{rel}: ...{p['prose'][max(0, m.start() - 80):m.end() + 40]!r}..."
           for rel, p in crawl["pages"].items() for m in [_re_raw_table.search(p["prose"])] if m]
    assert not raw, f"{len(raw)} pages show raw Markdown table text:\n" + "\n".join(raw[:10])
    nbs, chapters = chapter_notebooks()
    want = {("index.html" if p.name == "index.ipynb" else html_of(p, nbs)): markdown_tables(p)
            for p in chapters + [nbs / "index.ipynb"]}
    missing = [f"{rel}: {crawl['pages'][rel]['tables']} tables shown, {n} in its Markdown outputs"
               for rel, n in want.items() if crawl["pages"][rel]["tables"] < n]
    assert sum(want.values()), "no notebook has a Markdown output with a table: nothing checked"
    assert not missing, "Markdown output tables not rendered as tables:\n" + "\n".join(missing)
    print(f"tables: {sum(want.values())} in Markdown outputs, "
          f"{sum(p['tables'] for p in crawl['pages'].values())} rendered in cell outputs; no raw table text")


def test_no_link_to_a_placeholder_home(crawl):
    "settings.ini's `user = example` is a placeholder: no link may lead to github.com/example (it 404s)."
    cfg = _cfg()
    bad_prefixes = {"github.com/example/", "example.github.io"}
    if not home_url(): bad_prefixes |= {urlparse(cfg.git_url).netloc + urlparse(cfg.git_url).path.rstrip("/") + "/"}
    bad = [f"{rel}: {h}" for rel, p in crawl["pages"].items() for h in p["links"]
           if any(b in h for b in bad_prefixes)]
    assert not bad, f"{len(bad)} links to a placeholder home:\n" + "\n".join(bad[:20])
    print(f"links: {sum(len(p['links']) for p in crawl['pages'].values())} checked on {len(crawl['pages'])} pages, "
          f"none to a placeholder home ({', '.join(sorted(bad_prefixes))})")


_re_fontsize = re.compile(r"\b(?:fontsize|labelsize)\s*=\s*(\d+(?:\.\d+)?)")


def smallest_font_pt() -> float:
    "The smallest font size a figure is drawn with: matplotlib's default (10 pt), or any `fontsize=` (`labelsize=`) "
    "in the package's modules or in a notebook's code cells (a chapter may draw its own figure)."
    import matplotlib
    sizes = [float(matplotlib.rcParamsDefault["font.size"])]
    nbs, chapters = chapter_notebooks()
    code = [f.read_text(encoding="utf-8") for f in (ROOT / _cfg().lib_path).rglob("*.py")]
    code += [c.source for p in chapters + [nbs / "index.ipynb"] for c in read_nb(p).cells if c.cell_type == "code"]
    for text in code: sizes += [float(x) for x in _re_fontsize.findall(text)]
    return min(sizes)


def png_dpi(path: Path) -> float:
    "A PNG's resolution from its pHYs chunk (matplotlib writes it: the figure's savefig dpi); 72 if it has none."
    import struct
    b = path.read_bytes()
    i = b.find(b"pHYs")
    if i < 0: return 72.0
    px, _, unit = struct.unpack(">IIB", b[i + 4:i + 13])
    return px * 0.0254 if unit == 1 else 72.0


MIN_TEXT_PX = 8


def figure_text_px(fig: dict, img: Path, pt: float) -> float:
    "Height in CSS px of `pt`-point text in a figure as displayed: pt at the PNG's dpi, scaled by shown / natural width."
    return pt * png_dpi(img) / 72 * fig["shown"] / fig["natural"]


def test_figures_readable_as_displayed(site, crawl):
    "Every stored plot, as the browser lays it out (1440 px wide window): its smallest text (the package's smallest "
    "font size at the PNG's dpi, scaled to the displayed width) is at least 8 px."
    pt, small, n, px_all = smallest_font_pt(), [], 0, []
    for rel, p in crawl["pages"].items():
        for fig in p["figs"]:
            r = _resolve(rel, fig["src"])
            if not r or not fig["natural"] or not (site["out"] / r[0]).is_file(): continue
            n += 1
            px = figure_text_px(fig, site["out"] / r[0], pt)
            px_all.append(px)
            if px < MIN_TEXT_PX:
                small.append(f"{rel}: {fig['src']} shown {fig['shown']:.0f} of {fig['natural']} px: "
                             f"{pt:g} pt text is {px:.1f} px")
    assert n, "no figure measured"
    print(f"figures: {n} measured; smallest text {min(px_all):.1f} px as displayed ({pt:g} pt)")
    assert not small, f"{len(small)} figures with text under {MIN_TEXT_PX} px as displayed:\n" + "\n".join(small[:20])


def test_a_click_enlarges_a_figure(crawl):
    "A figure shown smaller than its natural width (a narrow window) is readable on a click: it opens on top of the "
    "page at its natural width, or as wide as the window allows."
    z = crawl["zoom"]
    assert z, f"{crawl['chapter']}: clicking its first plot opened nothing (.streamnb-zoom)"
    assert z["shown"] >= min(z["natural"], 0.9 * z["window"]) - 1, f"{crawl['chapter']}: the enlarged plot is {z}"


def test_modidx_links_resolve_on_this_site(crawl):
    "streamnb/_modidx.py (nbdev's symbol index) links work here: same page names, same anchors."
    modidx = importlib.import_module(f"{_cfg().lib_name}._modidx").d["syms"]
    bad = []
    for mod, syms in modidx.items():
        for sym, (link, _) in syms.items():
            if any(s.startswith("_") for s in sym.split(".")): continue
            page, _, frag = link.partition("#")
            if page not in crawl["pages"] or frag not in crawl["pages"][page]["ids"]: bad.append(f"{sym}: {link}")
    assert not bad, f"{len(bad)} _modidx links that do not resolve:\n" + "\n".join(bad[:30])


def test_search_finds_symbols_and_prose(server, browser):
    "The search page (Sphinx's index, run by the browser) finds a public class on its API page and a chapter by a "
    "word of its title."
    api = public_api()
    mod, cls = next((m, n) for m, names in api.items() for n in names
                    if inspect.isclass(getattr(importlib.import_module(m), n, None)))
    nbs, chapters = chapter_notebooks()
    last = chapters[-1]
    title = next(re.search(r"^#\s+(.+)$", c.source, re.M).group(1) for c in read_nb(last).cells
                 if c.cell_type == "markdown" and re.search(r"^#\s+(.+)$", c.source, re.M))
    word = max(re.findall(r"[A-Za-z]{4,}", title), key=len)
    page = browser.new_page()
    try:
        for q, want in ((cls, f"api/{mod.split('.', 1)[-1]}.html"), (word, html_of(last, nbs))):
            page.goto(server + "search.html?q=" + quote(q), wait_until="networkidle")
            page.wait_for_selector("#search-results ul.search li", timeout=20000)
            hits = page.eval_on_selector_all("#search-results ul.search li a", "as => as.map(a => a.getAttribute('href'))")
            assert any(h.split("#")[0].split("?")[0] == want for h in hits), f"search {q!r}: {want} not in {hits[:10]}"
    finally:
        page.close()


def test_screenshots_saved(site, crawl):
    for name in ("index.png", "chapter.png"):
        f = site["out"] / "_check" / name
        assert f.is_file() and f.stat().st_size > 10_000, f"screenshot {f} missing or blank"


def test_each_check_catches_its_failure(tmp_path):
    "Each check broken on purpose, without a browser: raw table text, a placeholder link, a figure shrunk below 8 px."
    raw = {"pages": {"index.html": {"prose": "seed vs streamnb\n| mode | syncs |\n|---|---|\n| seed | 4 |", "tables": 9,
                                     "links": []}}}
    with pytest.raises(AssertionError, match="raw Markdown table text"): test_markdown_tables_render_as_tables(raw)
    assert _re_raw_table.search("| a |—|—|") and not _re_raw_table.search("a - b | c")
    bad = {"pages": {"graph.html": {"links": ["https://github.com/example/streamnb/blob/main/nbs/01_graph.ipynb"]}}}
    with pytest.raises(AssertionError, match="placeholder home"): test_no_link_to_a_placeholder_home(bad)
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(8, 2)); fig.text(0.1, 0.5, "7 pt", fontsize=7); fig.savefig(tmp_path / "f.png", dpi=100)
    plt.close(fig)
    assert round(png_dpi(tmp_path / "f.png")) == 100
    shrunk = figure_text_px({"shown": 400, "natural": 800}, tmp_path / "f.png", 7)   # shown at half its width
    assert shrunk < MIN_TEXT_PX <= figure_text_px({"shown": 800, "natural": 800}, tmp_path / "f.png", 7)


# --- a laptop's width: 1280 and 1024 px ---

LAPTOP_WIDTHS = (1280, 1024)
_HASH_ALT = re.compile(r"^[0-9a-f]{16,}(\.png)?$|^$")

_LAPTOP_JS = """() => {
  const W = document.documentElement.clientWidth;
  const main = document.querySelector('article[role=main]') || document.body;
  return {
    scroll: document.documentElement.scrollWidth - W,
    cut: Array.from(main.querySelectorAll('.cell_output pre')).filter(p => p.scrollWidth > p.clientWidth + 1)
           .map(p => p.textContent.trim().slice(0, 60)),
    tables: Array.from(main.querySelectorAll('table')).filter(t => t.getBoundingClientRect().right > W + 1)
           .map(t => t.textContent.trim().slice(0, 60)),
    figs: Array.from(main.querySelectorAll('.cell_output img')).map(i => ({src: i.getAttribute('src'), alt: i.alt,
           natural: i.naturalWidth, shown: i.getBoundingClientRect().width, zoom: getComputedStyle(i).cursor})),
  };
}"""

# each fault the checks must catch, made on a page that has them all: a wide block, an output line that does not
# wrap, a table wider than the page, a figure with a file name for alt text and shown at a third of its width
_BREAK_JS = """() => {
  const main = document.querySelector('article[role=main]') || document.body;
  const wide = document.createElement('div'); wide.style.width = '3000px'; wide.textContent = 'x'; main.appendChild(wide);
  const out = document.createElement('div'); out.className = 'cell_output';
  out.innerHTML = '<pre style="white-space: pre; overflow-x: auto">' + 'a grade line '.repeat(40) + '</pre>' +
                  '<table style="display: table; width: 2500px; max-width: none"><tr><td>wide table</td></tr></table>' +
                  '<img alt="0a1b2c3d4e5f60718293a4b5c6d7e8f9.png" style="width: 200px">';
  main.appendChild(out);
  const src = document.querySelector('.cell_output img');   // its own relative src: the check resolves it on disk
  if (src) out.querySelector('img').setAttribute('src', src.getAttribute('src'));
  return new Promise(r => setTimeout(r, 200));
}"""


@pytest.fixture(scope="module")
def laptop(crawl, server, browser):
    "Every page at 1280 and 1024 px: what overflows, and each figure as shown; and one page broken on purpose."
    seen, page = {}, browser.new_page()
    for w in LAPTOP_WIDTHS:
        page.set_viewport_size({"width": w, "height": 800})
        for rel in crawl["pages"]:
            page.goto(server + quote(rel), wait_until="networkidle")
            page.evaluate("() => Promise.all(Array.from(document.images).map(i => { i.loading = 'eager'; "
                          "return i.decode().catch(() => null); }))")
            seen[(w, rel)] = page.evaluate(_LAPTOP_JS)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(server + quote(crawl["chapter"]), wait_until="networkidle")
    page.evaluate(_BREAK_JS)
    broken = page.evaluate(_LAPTOP_JS)
    page.close()
    return {"seen": seen, "broken": broken}


def laptop_problems(m: dict, rel: str, w: int, out: Path | None = None, pt: float | None = None) -> list[str]:
    "What is wrong with one page at width `w`, as measured by `_LAPTOP_JS` (figure text needs `out` and `pt`)."
    bad = [f"{w}px {rel}: the page scrolls sideways by {m['scroll']} px"] if m["scroll"] > 0 else []
    bad += [f"{w}px {rel}: an output line is cut (no wrap): {t!r}" for t in m["cut"]]
    bad += [f"{w}px {rel}: a table runs past the page: {t!r}" for t in m["tables"]]
    for f in m["figs"]:
        if _HASH_ALT.match(f["alt"] or "") or not f["alt"].startswith("figure"):
            bad.append(f"{w}px {rel}: figure {f['src']} has alt text {f['alt']!r}, not its title")
        r = _resolve(rel, f["src"]) if out is not None and f["src"] else None
        if w == 1280 and r and f["natural"] and (out / r[0]).is_file():
            px = figure_text_px(f, out / r[0], pt)
            if px < MIN_TEXT_PX:   # readable as shown, not only on a click (which enlarges every figure too)
                bad.append(f"{w}px {rel}: figure {f['src']} text {px:.1f} px as shown at 1280 px"
                           + ("" if f["zoom"] == "zoom-in" else ", and no enlargement on click"))
    return bad


def test_a_laptop_width_shows_every_page_whole(site, laptop):
    """At 1280 and 1024 px: no page scrolls sideways, output lines wrap, tables stay within the page, every figure's
    alt text comes from its title, and at 1280 figure text is at least 8 px as shown (at 1024 a click enlarges it)."""
    pt, bad, small = smallest_font_pt(), [], []
    for (w, rel), m in laptop["seen"].items():
        bad += laptop_problems(m, rel, w, site["out"], pt)
        small += [figure_text_px(f, site["out"] / r[0], pt) for f in m["figs"] if w == 1280 and f["natural"]
                  and (r := _resolve(rel, f["src"])) and (site["out"] / r[0]).is_file()]
    print(f"laptop widths: {len(laptop['seen'])} page views; figure text at 1280 px: smallest "
          f"{min(small, default=0):.1f} px, {sum(px < MIN_TEXT_PX for px in small)} of {len(small)} under "
          f"{MIN_TEXT_PX} px")
    assert not bad, f"{len(bad)} problems at a laptop's width:\n" + "\n".join(bad[:30])


def test_the_laptop_checks_catch_each_fault(site, laptop):
    """A page broken on purpose (a wide block, an unwrapped output, a wide table, a file name as alt text, a figure shown
    at 200 px): each caught."""
    bad = "\n".join(laptop_problems(laptop["broken"], "broken.html", 1280, site["out"], smallest_font_pt()))
    for said in ("scrolls sideways", "output line is cut", "table runs past the page", "not its title",
                 "px as shown at 1280 px"):
        assert said in bad, f"{said!r} not caught:\n{bad}"
