"""The documentation site, checked in a real browser (headless Chromium from Debian, driven by Playwright).

Builds the site (`tools/docs.py`, into settings.ini's doc_path, `_docs/`), serves it on 127.0.0.1 and visits every
page. Fails on a console error or failed request, an image that did not decode, an internal link or #anchor that
does not resolve, an empty page, a chapter missing from the sidebar (or out of order), a public symbol without an
API entry, or a search that finds nothing. Saves screenshots of the index page and of one chapter (its top, and its first plot) in
`_docs/_check/`.

Not part of the quick run: it runs when STREAMNB_SITE=1 (`.ci/run` sets it). Then a missing browser is a failure,
never a skip: `apt-get install -y chromium chromium-driver` and `pip install -e ".[dev]"` (playwright) bring it.
"""
import functools
import http.server
import importlib
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urljoin, urlparse, unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(os.environ.get("STREAMNB_SITE") != "1",
                                reason="browser check of the docs site: STREAMNB_SITE=1 pytest tests/test_site.py")
CHROMIUM = os.environ.get("STREAMNB_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _docs_module():
    sys.path.insert(0, str(ROOT / "tools"))
    try: return importlib.import_module("docs")
    finally: sys.path.pop(0)


@pytest.fixture(scope="module")
def site():
    docs = _docs_module()
    t0 = time.time()
    out = docs.build()
    build_s = time.time() - t0
    print(f"\nsite build: {build_s:.1f} s")
    assert build_s < 120, f"building the site took {build_s:.0f} s (the budget is 2 minutes)"
    meta = json.loads((docs.SRC / "_meta.json").read_text())
    return out, meta, docs


@pytest.fixture(scope="module")
def server(site):
    out = site[0]
    handler = functools.partial(_QuietHandler, directory=str(out))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a): pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    assert Path(CHROMIUM).exists(), (f"{CHROMIUM} is missing: apt-get update && apt-get install -y chromium "
                                     "chromium-driver (the browser check fails without it, it does not skip)")
    from playwright.sync_api import sync_playwright  # a dev requirement; ImportError here is a failure too
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, headless=True,
                                                   args=FLAGS, viewport={"width": 1280, "height": 900})
        yield ctx
        ctx.close()


_PAGE_JS = """() => {
  const main = document.querySelector('article[role=main]') || document.body;
  return {
    ids: Array.from(document.querySelectorAll('[id]')).map(e => e.id)
           .concat(Array.from(document.querySelectorAll('a[name]')).map(e => e.name)),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href')),
    images: Array.from(document.images).map(i => ({src: i.getAttribute('src'), ok: i.complete && i.naturalWidth > 0})),
    text: main.innerText.trim().length,
    sidebar: Array.from(document.querySelectorAll('.sidebar-tree a.reference')).map(a => a.getAttribute('href')),
  };
}"""


@pytest.fixture(scope="module")
def crawl(site, server, browser):
    "Visit every built page once; what the browser saw, by page path."
    out, meta, _ = site
    pages = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.html")
                   if not p.relative_to(out).parts[0].startswith(("_", ".")))
    seen, t0 = {}, time.time()
    page = browser.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"{page.url}: console error: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"{page.url}: page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"{page.url}: request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"{page.url}: HTTP {r.status}: {r.url}"))
    for rel in pages:
        page.goto(server + rel, wait_until="load")
        page.wait_for_load_state("networkidle")
        seen[rel] = page.evaluate(_PAGE_JS)
        if rel == "index.html":
            shot(page, out, "index.png")
    chapter = next(p["page"] for p in meta["pages"]
                   if p["page"] != "index" and any(i["ok"] for i in seen.get(p["page"] + ".html", {}).get("images", [])))
    page.goto(server + chapter + ".html", wait_until="networkidle")
    shot(page, out, "chapter.png")
    page.locator("article img").first.scroll_into_view_if_needed()
    shot(page, out, "chapter-plot.png")
    page.close()
    print(f"browser check: {len(pages)} pages in {time.time() - t0:.1f} s; screenshots in {out / '_check'}")
    return {"pages": seen, "problems": problems, "chapter": chapter}


def shot(page, out, name):
    (out / "_check").mkdir(exist_ok=True)
    page.screenshot(path=str(out / "_check" / name), full_page=False)


def test_no_console_errors_or_failed_requests(crawl):
    assert not crawl["problems"], "\n".join(crawl["problems"][:30])


def test_every_page_has_content(crawl):
    empty = [rel for rel, p in crawl["pages"].items() if p["text"] < 40 and rel not in ("search.html",)]
    assert not empty, f"empty pages: {empty}"


def test_images_decode(crawl):
    bad = [(rel, i["src"]) for rel, p in crawl["pages"].items() for i in p["images"] if not i["ok"]]
    assert not bad, f"images that did not decode (naturalWidth == 0): {bad}"
    assert sum(len(p["images"]) for p in crawl["pages"].values()) > 0, "no images at all: the plots are missing"


def _resolve(rel, href):
    "Internal link -> (target page path, fragment), or None for an external one."
    u = urlparse(href)
    if u.scheme or u.netloc or href.startswith(("mailto:", "javascript:")): return None
    target = urljoin("http://x/" + rel, u.path).removeprefix("http://x/") if u.path else rel
    target = unquote(target)
    if target.endswith("/") or target == "": target += "index.html"
    return target, unquote(u.fragment)


def test_internal_links_and_anchors_resolve(site, crawl):
    out = site[0]
    bad = []
    for rel, p in crawl["pages"].items():
        for href in p["links"]:
            r = _resolve(rel, href)
            if r is None: continue
            target, frag = r
            if not (out / target).is_file(): bad.append(f"{rel}: {href} -> no file {target}"); continue
            if frag and target in crawl["pages"] and frag not in crawl["pages"][target]["ids"]:
                bad.append(f"{rel}: {href} -> no #{frag} in {target}")
    assert not bad, f"{len(bad)} broken internal links:\n" + "\n".join(bad[:40])


def test_sidebar_lists_every_chapter_in_reading_order(site, crawl):
    out, meta, docs = site
    from nbdev.config import get_config
    nbs = docs.notebooks(Path(get_config(path=ROOT).nbs_path))  # from the files: never a hard-coded list
    expected = [docs.page_name(p) + ".html" for p in nbs if p.name != "index.ipynb"]
    assert len(expected) >= 2
    for rel, p in crawl["pages"].items():
        got = [_resolve(rel, h)[0] for h in p["sidebar"] if _resolve(rel, h)]
        chapters = [g for g in got if g in expected]
        missing = [e for e in expected if e not in chapters]
        assert not missing, f"{rel}: chapters missing from the sidebar: {missing}"
        assert chapters == expected, f"{rel}: sidebar order {chapters} != file-name order {expected}"
        assert "api/index.html" in got, f"{rel}: no API reference in the sidebar"


def test_api_reference_covers_every_public_symbol(site, crawl):
    out, meta, _ = site
    import streamnb
    missing, no_link = [], []
    for mod, short in meta["modules"].items():
        page = crawl["pages"].get(f"api/{short}.html")
        assert page, f"no API page for {mod}"
        m = importlib.import_module(mod)
        for name in m.__all__:
            if f"{mod}.{name}" not in page["ids"]: missing.append(f"{mod}.{name}")
        chapter = next(p for p in meta["pages"] if p["module"] == mod)
        if not any((_resolve(f"api/{short}.html", h) or ("",))[0] == chapter["page"] + ".html" for h in page["links"]):
            no_link.append(mod)
    assert not missing, f"public symbols without an API entry: {missing}"
    assert not no_link, f"API pages without a link to their chapter: {no_link}"
    nb_links = [h for p in crawl["pages"].values() for h in p["links"] if "/blob/" in h and h.endswith(".ipynb")]
    assert nb_links and not any(h.endswith(".py") for p in crawl["pages"].values() for h in p["links"]
                                if "/blob/" in h), "source links must point at the notebooks"


def test_modidx_links_resolve_on_this_site(site, crawl):
    "streamnb/_modidx.py (nbdev's symbol index) links work here: same page names, same anchors."
    modidx = importlib.import_module("streamnb._modidx").d["syms"]
    bad = []
    for mod, syms in modidx.items():
        for sym, (link, _) in syms.items():
            if sym.rsplit(".", 1)[-1].startswith("_") or "._" in sym: continue
            page, _, frag = link.partition("#")
            if page not in crawl["pages"] or frag not in crawl["pages"][page]["ids"]: bad.append(f"{sym}: {link}")
    assert not bad, f"{len(bad)} _modidx links that do not resolve:\n" + "\n".join(bad[:30])


def test_nbdev_directives_honoured(site):
    out, meta, _ = site
    html = {p["page"]: (out / f"{p['page']}.html").read_text(encoding="utf-8") for p in meta["pages"]}
    for page, text in html.items():
        # highlighted code: a comment that is a directive line would read <span class="c1">#| export</span>
        assert not re.search(r'<span class="c1">#\s*\|', text), f"{page}: a directive line is shown in code"
        assert "nbdev_export()" not in text, f"{page}: a #| hide cell is shown"
    for p in meta["pages"]:
        if p["cuda_cells"]:
            assert html[p["page"]].count("gpu-label") == p["cuda_cells"], f"{p['page']}: #| cuda cells not marked"
    assert any(p["cuda_cells"] for p in meta["pages"]), "no #| cuda cell found at all"


def test_search_finds_a_symbol(server, browser):
    page = browser.new_page()
    page.goto(server + "search.html?q=GraphBuilder", wait_until="networkidle")
    page.wait_for_selector("#search-results ul.search li", timeout=15000)
    n = page.locator("#search-results ul.search li").count()
    page.close()
    assert n > 0


def test_screenshots_saved(site, crawl):
    for name in ("index.png", "chapter.png"):
        f = site[0] / "_check" / name
        assert f.is_file() and f.stat().st_size > 10_000, f"screenshot {f} missing or blank"
