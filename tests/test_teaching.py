"""nbs/92_teaching.ipynb, the teacher's page: its class plan adds up to 90 minutes and names chapters and sections that
exist; each chapter it covers has two or three questions whose answers are asserts that hold; each misconception is
answered with a pointer into the course."""
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"
PAGE = NBS / "92_teaching.ipynb"


@pytest.fixture(scope="module")
def nb():
    return nbformat.read(PAGE, as_version=4)


def headings(name: str) -> set[str]:
    nb = nbformat.read(NBS / f"{name}.ipynb", as_version=4)
    return {m.group(1).strip() for c in nb.cells if c.cell_type == "markdown"
            for m in re.finditer(r"^#{1,4}\s+(.+)$", c.source, re.M)}


def plan_rows(nb):
    md = next(c.source for c in nb.cells if c.cell_type == "markdown" and "## A 90-minute class" in c.source)
    rows = [r for r in md.splitlines() if re.match(r"^\|\s*\d+[–-]\d+\s*\|", r)]
    return [[x.strip() for x in r.strip("|").split("|")] for r in rows]


def test_plan_adds_up_to_90_minutes(nb):
    rows = plan_rows(nb)
    spans = [tuple(map(int, re.split(r"[–-]", r[0]))) for r in rows]
    assert spans[0][0] == 0 and spans[-1][1] == 90
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans   # back to back, no gap


def test_plan_names_real_chapters_and_sections(nb):
    "Every `NN_name` the plan cites is a notebook, and every quoted section starts a heading of that notebook."
    missing = []
    for row in plan_rows(nb):
        chapter = re.search(r"`(\d+[a-z]?_\w+|index)`", row[1])
        assert chapter, row
        name = chapter.group(1)
        assert (NBS / f"{name}.ipynb").exists(), name
        hs = {re.sub(r"[`*]", "", h) for h in headings(name)}
        for sec in re.findall(r"\"([^\"]+)\"", row[1]):   # a section, by its heading or the heading's start
            if not any(h.startswith(re.sub(r"[`*]", "", sec)) for h in hs): missing.append(f"{name}: {sec}")
    assert not missing, missing


def test_questions_per_chapter_are_checked(nb):
    "Two or three questions per chapter section, each followed by a collapsed answer cell that asserts."
    sections = {}
    current = None
    cells = nb.cells
    for i, c in enumerate(cells):
        if c.cell_type == "markdown":
            m = re.search(r"^## Questions on .*\(`(\w+)`\)", c.source, re.M)
            if m: current = m.group(1); sections[current] = 0
            if current and re.search(r"^\*\*[A-Z]\d\.", c.source, re.M):
                answer = next(d for d in cells[i + 1:] if d.cell_type == "code" and "code-fold: true" in d.source)
                assert "assert" in answer.source, f"question without a checked answer: {c.source[:80]}"
                sections[current] += 1
            if "## Misconceptions" in c.source: current = None
    assert len(sections) >= 4, sections
    assert all(2 <= k <= 3 for k in sections.values()), sections
    for name in sections: assert (NBS / f"{name}.ipynb").exists(), name
    with_exercise = {p.stem for p in NBS.glob("*.ipynb") if re.search(r'"## Exercise', p.read_text(encoding="utf-8"))}
    assert len(with_exercise) >= 8 and with_exercise <= set(sections), sorted(with_exercise - set(sections))


MISCONCEPTIONS = ["wait_event` blocks the CPU", "Two streams always run in parallel", "record_stream` records an event now",
                  "The graph's inputs are ready on every stream"]


def test_misconceptions_answered_with_a_pointer(nb):
    md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for m in MISCONCEPTIONS:
        i = md.find(m)
        assert i >= 0, m
        para = md[i:md.find("</details>", i)]   # the sentence and its answer, collapsed
        cited = re.findall(r"`(\d+[a-z]?_\w+)`", para) + re.findall(r"primer's (?:section )?\"([^\"]+)\"", para)
        assert cited, f"{m}: no pointer into the course"
        for name in re.findall(r"`(\d+[a-z]?_\w+)`", para): assert (NBS / f"{name}.ipynb").exists(), name


def test_the_page_runs():
    "The answers hold: every cell of the page runs (nbdev's own test runner)."
    from nbdev.test import test_nb
    ok, _ = test_nb(PAGE, skip_flags=["cuda"])
    assert ok


def test_no_answer_before_the_class_answers(nb):
    """The answers stay collapsed until the teacher opens them, in Jupyter and on the site: the answer cells are folded
    and print nothing (their asserts hold the numbers), each misconception's answer and each explanation after a
    question sits in a <details> block."""
    for c in nb.cells:
        if c.cell_type == "code" and "code-fold: true" in c.source:
            assert "print(" not in c.source and not c.get("outputs"), c.source[:80]
    md = [c.source for c in nb.cells if c.cell_type == "markdown"]
    i = next(k for k, s in enumerate(md) if "## Misconceptions" in s)
    for s in md[i:]:
        for m in re.finditer(r'^\*\*".+?"\*\*(.*)$', s, re.M):
            assert m.group(1).strip() == "", m.group(0)          # nothing after the sentence on its line
            assert s[m.end():].lstrip().startswith("<details>"), m.group(0)
    assert sum("<details>" in s for s in md) >= len(MISCONCEPTIONS) + 1
