"""tools/student.py: the student edition has no worked solutions and no test lines, every notebook is still a valid
notebook, and the exported code is exactly the course's (so the package and its graders are unchanged)."""
import ast
import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NBS = ROOT / "nbs"
_dir = re.compile(r"^\s*#\s*\|\s*([\w-]+):?\s*(.*)$")


def _tool():
    spec = importlib.util.spec_from_file_location("streamnb_student_tool", ROOT / "tools" / "student.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dirs(cell) -> dict:
    "The leading `#|` directives of a code cell (read here, independently of the tool)."
    out = {}
    for line in cell.source.splitlines():
        m = _dir.match(line)
        if not m:
            if line.strip(): break
            continue
        out[m.group(1)] = m.group(2).strip().lower()
    return out


def exported(cell) -> bool: return cell.cell_type == "code" and bool({"export", "exports", "exporti"} & set(dirs(cell)))
def solution(cell) -> bool: return cell.cell_type == "code" and dirs(cell).get("code-fold") == "true"


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    "The student edition of a copy of nbs/ (others may be editing nbs/ meanwhile), and whether the copy was left alone."
    src = tmp_path_factory.mktemp("nbs") / "nbs"
    shutil.copytree(NBS, src, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.rglob("*.ipynb")}
    out = tmp_path_factory.mktemp("student")
    written = _tool().build(out, src, quiet=True)
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.rglob("*.ipynb")}
    return {"src": src, "out": out, "written": written, "untouched": before == after}


def pairs(edition):
    for p in edition["written"]:
        yield edition["src"] / p.relative_to(edition["out"]), p


def test_every_notebook_written_and_valid(edition):
    src = edition["src"]
    want = sorted(p.relative_to(src) for p in src.rglob("*.ipynb")
                  if not any(s.startswith(("_", ".")) for s in p.relative_to(src).parts))
    assert sorted(p.relative_to(edition["out"]) for p in edition["written"]) == want
    for _, p in pairs(edition):
        json.loads(p.read_text(encoding="utf-8"))               # valid JSON
        nbformat.validate(nbformat.read(p, as_version=4))      # and a valid notebook
    assert edition["untouched"], "tools/student.py changed a notebook in nbs/"


def test_no_worked_solutions(edition):
    "Solution cells (`#| code-fold: true`) are gone; an exported one stays, unchanged and collapsed in Jupyter."
    seen = kept = 0
    for orig, p in pairs(edition):
        o, s = nbformat.read(orig, as_version=4), nbformat.read(p, as_version=4)
        sols = [c.source for c in o.cells if solution(c)]
        seen += len(sols)
        left = [c for c in s.cells if solution(c)]
        for c in left:
            assert exported(c), f"{p.name}: a worked solution is still there:\n{c.source[:200]}"
            assert c.metadata.get("jupyter", {}).get("source_hidden") is True, f"{p.name}: exported solution not collapsed"
            kept += 1
        gone = [src for src in sols if src not in {c.source for c in s.cells}]
        assert len(gone) + len(left) == len(sols)
    assert seen >= 8 and kept < seen, (seen, kept)   # the course has solutions, and most are not exported


def _test_lines(source: str) -> list[str]:
    try: tree = ast.parse(source)
    except SyntaxError: return []
    out = []
    for st in tree.body:
        if isinstance(st, ast.Assert) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                                          and isinstance(st.value.func, ast.Name)
                                          and st.value.func.id.startswith("test")):
            out.append(ast.get_source_segment(source, st))
    return out


def test_no_test_lines(edition):
    "No top-level `test_eq(...)`/`test_fail(...)`/`assert` is left outside exported cells; the course had many."
    had = 0
    for orig, p in pairs(edition):
        had += sum(len(_test_lines(c.source)) for c in nbformat.read(orig, as_version=4).cells
                   if c.cell_type == "code" and not exported(c))
        for c in nbformat.read(p, as_version=4).cells:
            if c.cell_type == "code" and not exported(c):
                assert not _test_lines(c.source), f"{p.name}: test lines left: {_test_lines(c.source)[:3]}"
    assert had > 100, had


def test_exported_code_unchanged(edition):
    "The exported cells, in order, are the course's own: nbdev_export on the student edition writes the same modules."
    for orig, p in pairs(edition):
        want = [c.source for c in nbformat.read(orig, as_version=4).cells if exported(c)]
        got = [c.source for c in nbformat.read(p, as_version=4).cells if exported(c)]
        assert got == want, f"{p.name}: exported code differs"


def test_the_learner_still_has_the_exercise(edition):
    "The primer's exercise is still there for the learner: the task, the empty answer cell, and the prose."
    s = nbformat.read(edition["out"] / "00_primer.ipynb", as_version=4)
    src = [c.source for c in s.cells]
    assert any("ex = wait_exercise()" in x for x in src)
    assert any("## Exercise: wait without blocking the host" in x for x in src)
    i = next(i for i, x in enumerate(src) if "Your answer goes in the empty cell below" in x)
    assert s.cells[i + 1].cell_type == "code" and not s.cells[i + 1].source.strip()


def test_strip_tests_keeps_the_rest():
    strip = _tool().strip_tests
    src = "x = 1\ntest_eq(x,\n        1)\nassert x == 1, 'no'\nprint(x)\nfor k in (1, 2): test_eq(k, k)"
    assert strip(src) == "x = 1\nprint(x)"
    assert strip("%timeit f()\ntest_eq(1, 1)") == "%timeit f()\ntest_eq(1, 1)"   # does not parse: unchanged
