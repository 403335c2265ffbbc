"""tools/student.py: the student edition has no worked solutions and no test lines, every notebook is still a valid
notebook, and the exported code is exactly the course's but for the worked solutions, which it imports from the package
(so the package and its graders are unchanged)."""
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


def _tree(source):
    try: return ast.parse(source)
    except SyntaxError: return None


def _defined(source) -> set[str]:
    "Names a cell binds: functions, classes, assignments, imports, loop targets."
    tree, out = _tree(source), set()
    for n in ast.walk(tree) if tree else ():
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)): out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store): out.add(n.id)
        elif isinstance(n, ast.alias): out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, ast.arg): out.add(n.arg)   # a parameter, read in its function's body
    return out


def _read(source) -> set[str]:
    tree = _tree(source)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} if tree else set()


def test_no_worked_solutions(edition):
    """No solution cell (`#| code-fold: true`) is left: each is dropped, or, where the package exports it (the graders
    grade against it, other cells call it), replaced by an import of the names it defines from the package; none of
    the edition's cells holds a solution's body."""
    seen = imported = 0
    for orig, p in pairs(edition):
        o, s = nbformat.read(orig, as_version=4), nbformat.read(p, as_version=4)
        assert not [c.get("id") for c in s.cells if solution(c)], f"{p.name}: a worked solution is still there"
        by_id = {c.get("id"): c for c in s.cells}
        for c in o.cells:
            if not solution(c): continue
            seen += 1
            body = "\n".join(c.source.splitlines()[-2:])   # a solution's last lines (its edits, its return)
            assert not any(body in d.source for d in s.cells), f"{p.name}: the solution's code is in the edition"
            if exported(c):
                names = {n.name for n in _tree(c.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                got = by_id[c.get("id")]
                imp = [n for n in _tree(got.source).body if isinstance(n, ast.ImportFrom)]
                assert len(imp) == 1 and imp[0].module.startswith("streamnb.") and {a.name for a in imp[0].names} == names
                assert importlib.import_module(imp[0].module)   # the module the cell exports to
                for n in names: assert hasattr(importlib.import_module(imp[0].module), n), (p.name, n)
                imported += 1
            else: assert c.get("id") not in by_id
    assert seen >= 8 and 0 < imported < seen, (seen, imported)   # the course has solutions, most are not exported


def test_a_solution_other_cells_call_must_be_exported(tmp_path):
    "A notebook whose non-exported worked solution another cell calls is refused, naming the cell and what to do."
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("#| default_exp x"),
                nbformat.v4.new_code_cell("#| code-fold: true\ndef solve(gm): return gm", id="sol1"),
                nbformat.v4.new_code_cell("solve(1)")]
    (tmp_path / "nbs").mkdir(); nbformat.write(nb, tmp_path / "nbs" / "a.ipynb")
    with pytest.raises(SystemExit, match=r"a.ipynb, cell sol1: the worked solution defines \['solve'\].*export it"):
        _tool().build(tmp_path / "out", tmp_path / "nbs", quiet=True)


def test_nothing_used_that_only_a_dropped_cell_defined(edition):
    "Every name the student edition reads is still bound in it: dropping a solution broke no later cell."
    for orig, p in pairs(edition):
        o, s = nbformat.read(orig, as_version=4), nbformat.read(p, as_version=4)
        kept_src = {c.source for c in s.cells}
        dropped = set().union(*(_defined(c.source) for c in o.cells if c.cell_type == "code" and c.source not in kept_src
                                and solution(c)))
        code = [c.source for c in s.cells if c.cell_type == "code"]
        bound = set().union(*map(_defined, code))
        read = set().union(*map(_read, code))
        assert not (read & dropped) - bound, f"{p.name}: {sorted((read & dropped) - bound)} defined only in a dropped cell"


@pytest.mark.parametrize("name", ["00_primer", "08_exercises", "12_dealloc"])
def test_a_student_notebook_runs(edition, name):
    """The primer, chapter 08 (whose examples call its exercise's `solve`) and chapter 12 (whose grader grades against
    an exported solution) run in the student edition as they are, their solutions imported from the package."""
    from nbdev.test import test_nb
    ok, _ = test_nb(edition["out"] / f"{name}.ipynb", skip_flags=["cuda"])
    assert ok


def _test_lines(source: str) -> list[str]:
    try: tree = ast.parse(source)
    except SyntaxError: return []
    out = []
    for st in ast.walk(tree):   # at any depth: in loops, `with` blocks and functions too
        if isinstance(st, ast.Assert) or (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
                                          and isinstance(st.value.func, ast.Name)
                                          and st.value.func.id.startswith("test")):
            out.append(ast.get_source_segment(source, st))
    return out


def test_no_test_lines(edition):
    "No `test_eq(...)`/`test_fail(...)`/`assert`, at any depth, is left outside exported cells; the course had many."
    had = 0
    for orig, p in pairs(edition):
        had += sum(len(_test_lines(c.source)) for c in nbformat.read(orig, as_version=4).cells
                   if c.cell_type == "code" and not exported(c))
        for c in nbformat.read(p, as_version=4).cells:
            if c.cell_type == "code" and not exported(c):
                assert not _test_lines(c.source), f"{p.name}: test lines left: {_test_lines(c.source)[:3]}"
    assert had > 100, had


def test_exported_code_unchanged(edition):
    "The exported cells but the worked solutions, in order, are the course's own: the package's code, as it is."
    for orig, p in pairs(edition):
        want = [c.source for c in nbformat.read(orig, as_version=4).cells if exported(c) and not solution(c)]
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


def test_strip_tests_inside_blocks():
    "Tests inside loops, `with` blocks and functions go too; an emptied body gets a `pass`; a shared line stays."
    strip = _tool().strip_tests
    src = ("for i in range(3):\n    y = i\n    test_eq(y, i)\n"
           "with ctx() as c:\n    test_fail(lambda: 1,\n              contains='a')\n"
           "def h(a):\n    assert a\n"
           "try:\n    z = 1\n    assert z\nexcept Exception:\n    pass\n"
           "a = 2; test_eq(a, 2)\ntest_eq(1, 1); test_eq(2, 2)")
    out = strip(src)
    assert out == ("for i in range(3):\n    y = i\ndef h(a):\n    pass\ntry:\n    z = 1\nexcept Exception:\n    pass\n"
                   "a = 2; test_eq(a, 2)"), out
    compile(out, "<student>", "exec")


def _answer_cell(cell) -> bool:
    "An answer cell as the learner gets it: empty, or only comments and a fresh start graph (`answer = ex.start()`)."
    lines = [l.strip() for l in cell.source.splitlines() if l.strip() and not l.strip().startswith("#")]
    return cell.cell_type == "code" and all(re.fullmatch(r"answer = [\w.]+\(\)", l) for l in lines)


@pytest.mark.parametrize("path", sorted(NBS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_solutions_collapsed_after_the_learners_cell(path):
    """In the course itself (Jupyter and the site): every worked solution (`#| code-fold: true`) starts collapsed in
    Jupyter too (`metadata.jupyter.source_hidden`), and each exercise gives the learner an answer cell before its first
    solution."""
    cells = nbformat.read(path, as_version=4).cells
    folds = [i for i, c in enumerate(cells) if solution(c)]
    for i in folds:
        assert cells[i].metadata.get("jupyter", {}).get("source_hidden") is True, f"{path.name}: cell {cells[i].get('id')} not collapsed"
    for c in cells:   # a worked solution written as a function (chapter 14's was shown, open, above the answer cell)
        if c.cell_type == "code" and re.search(r"^def \w+_solution\(", c.source, re.M):
            assert solution(c), f"{path.name}: cell {c.get('id')} defines a worked solution but is not `#| code-fold: true`"
    for e, c in enumerate(cells):
        if c.cell_type == "markdown" and re.search(r"^#+ Exercise", c.source, re.M):
            first = next((i for i in folds if i > e), None)
            assert first is not None, f"{path.name}: an exercise without a worked solution"
            assert any(_answer_cell(cells[i]) for i in range(e, first)), f"{path.name}: no answer cell before the solution"
