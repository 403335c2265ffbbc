"""The student edition of the course: `python tools/student.py [FOLDER]` (default `_student/`).

Writes every notebook of settings.ini's `nbs_path` (found as nbdev finds them: names starting with `_` or `.` are
skipped) into FOLDER, read and written with nbdev's own notebook tools (`execnb.nbio.read_nb` / `write_nb`,
`nbdev.process.extract_directives`), with:
- the worked solutions gone: a cell marked `#| code-fold: true` is dropped; an exported one (the package needs it:
  the graders grade against it, and other cells call it, as chapter 08's `solve`) becomes a one-line import of the
  same names from the module it exports to, so every notebook of the edition still runs and none shows a solution.
  A solution another cell calls must be exported (the tool refuses otherwise, naming the cell);
- the test lines gone: `test_eq(...)`, `test_fail(...)`, `test_close(...)` ... calls (fastcore.test) and `assert`
  statements, whole statements even over several lines, also inside loops, `with` blocks and functions (a body left
  empty gets a `pass`); a cell left with nothing but comments is dropped,
  a cell that lost lines loses its stored outputs;
- everything else as it is: the other exported cells are never touched, and markdown, plots and outputs stay.
The edition runs on the installed package (`pip install -e .`); it is for reading and answering, not for `nbdev_export`.
Nothing in nbs/ is changed. The folder is rewritten from scratch on each run.
"""
from __future__ import annotations

import argparse
import ast
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_CALLS = {"test", "test_eq", "test_ne", "test_close", "test_fail", "test_is", "test_eq_type", "test_shuffled",
              "test_stdout", "test_warns", "test_fig_exists", "test_sig"}
EXPORTS = {"export", "exports", "exporti"}


def notebooks(nbs_path: Path) -> list[Path]:
    return sorted(p for p in nbs_path.rglob("*.ipynb")
                  if not any(s.startswith(("_", ".")) for s in p.relative_to(nbs_path).parts))


def directives(cell) -> dict:
    from nbdev.process import extract_directives
    if cell.cell_type != "code": return {}
    return {k.rstrip(":"): v for k, v in extract_directives(cell, remove=False).items()}   # `code-fold:` -> code-fold


def is_solution(dirs: dict) -> bool:
    return [v.lower() for v in dirs.get("code-fold", [])] == ["true"]


def is_exported(dirs: dict) -> bool: return bool(EXPORTS & set(dirs))


_BLOCKS = (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.If)


def _is_test(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assert): return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        return isinstance(f, ast.Name) and f.id in TEST_CALLS
    if isinstance(stmt, _BLOCKS):   # a block that only tests (`for x in xs: test_eq(...)`, `with ...: test_fail(...)`)
        return all(_is_test(s) for s in stmt.body) and all(_is_test(s) for s in getattr(stmt, "orelse", []))
    return False


def _bodies(stmt: ast.stmt):
    "The statement lists nested in a compound statement (loop, with, if, try, def, class bodies)."
    for field in ("body", "orelse", "finalbody"):
        b = getattr(stmt, field, None)
        if isinstance(b, list) and b and isinstance(b[0], ast.stmt): yield b
    for h in getattr(stmt, "handlers", []): yield h.body


def strip_tests(source: str) -> str:
    """The source without its test statements, at any depth (unchanged if it does not parse, e.g. a `%` magic). A nested
    body left with nothing gets a `pass`; a test sharing a line with a statement that is not a test is kept (it cannot be cut out)."""
    try: tree = ast.parse(source)
    except SyntaxError: return source
    lines = source.splitlines(True)
    drop, passes = set(), {}
    def alone(stmt, body):   # no statement but tests on its lines
        return all(o is stmt or o.end_lineno < stmt.lineno or o.lineno > stmt.end_lineno or _is_test(o) for o in body)
    def walk(body, nested):
        tests = [st for st in body if _is_test(st) and alone(st, body) and True]
        for st in tests: drop.update(range(st.lineno - 1, st.end_lineno))
        if nested and tests and len(tests) == len(body):   # keep the block valid
            passes[tests[0].lineno - 1] = " " * tests[0].col_offset + "pass\n"
        for st in body:
            if st not in tests:
                for b in _bodies(st):
                    if b[0].lineno != st.lineno: walk(b, True)   # a one-line block (`if x: test_eq(...)`) stays as it is
    walk(tree.body, False)
    out = [passes.get(i, l) for i, l in enumerate(lines) if i not in drop or i in passes]
    return "".join(out).rstrip("\n")


def _parse(source: str):
    try: return ast.parse(source)
    except SyntaxError: return None


def defines(source: str) -> set[str]:
    "The functions and classes a cell defines at top level."
    tree = _parse(source)
    return set() if tree is None else {s.name for s in tree.body
                                       if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def uses(source: str) -> set[str]:
    "The names a cell reads."
    tree = _parse(source)
    return set() if tree is None else {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def needed_elsewhere(cells, i: int) -> set[str]:
    "What cell `i` defines (functions, classes) that another code cell of the notebook reads."
    others = set().union(*(uses(c.source) for j, c in enumerate(cells) if j != i and c.cell_type == "code"))
    return defines(cells[i].source) & others


def _only_comments(source: str) -> bool:
    return all(not l.strip() or l.lstrip().startswith("#") for l in source.splitlines())


def export_module(nb, dirs: dict) -> str:
    "The module an exported cell goes to: its `#| export NAME`, else the notebook's `#| default_exp`."
    named = [v for k in EXPORTS for v in dirs.get(k, [])]
    if named: return named[0]
    for c in nb.cells:
        d = directives(c)
        if "default_exp" in d: return d["default_exp"][0]
    raise SystemExit(f"student: {nb.path_}: an exported cell but no #| default_exp")


def solution_import(nb, cell, dirs: dict, lib: str) -> str:
    "What an exported worked solution becomes in the student edition: an import of the names it defines."
    names = ", ".join(sorted(defines(cell.source)))
    return (f"# The worked solution is in the package (the grader grades against it): read it there once you tried.\n"
            f"from {lib}.{export_module(nb, dirs)} import {names}")


def student_nb(path: Path, lib: str = "streamnb"):
    "The student edition of one notebook (an execnb notebook object) and what was removed: (solutions, test cells)."
    from execnb.nbio import read_nb
    nb = read_nb(path)
    cells, n_sol, n_test = [], 0, 0
    for i, cell in enumerate(nb.cells):
        dirs = directives(cell)
        if cell.cell_type == "code" and is_solution(dirs):
            n_sol += 1
            if is_exported(dirs):
                cell.source, cell.outputs, cell.execution_count = solution_import(nb, cell, dirs, lib), [], None
            elif needed_elsewhere(nb.cells, i):
                raise SystemExit(f"student: {path.name}, cell {cell.get('id')}: the worked solution defines "
                                 f"{sorted(needed_elsewhere(nb.cells, i))}, which other cells call; export it "
                                 "(`#| exporti`) so the student edition can import it instead of showing it")
            else: continue
        elif cell.cell_type == "code" and not is_exported(dirs) and cell.source.strip():
            new = strip_tests(cell.source)
            if new != cell.source.rstrip("\n"):
                n_test += 1
                if _only_comments(new): continue
                cell.source, cell.outputs, cell.execution_count = new, [], None
        cells.append(cell)
    nb.cells = cells
    return nb, (n_sol, n_test)


def build(out: Path, nbs_path: Path | None = None, quiet: bool = False) -> list[Path]:
    from execnb.nbio import write_nb
    from nbdev.config import get_config
    cfg = get_config(path=ROOT)
    if nbs_path is None: nbs_path = Path(cfg.nbs_path)
    out = Path(out)
    if out.resolve() in (ROOT.resolve(), Path(nbs_path).resolve()):
        sys.exit(f"student: refusing to write into {out}")
    shutil.rmtree(out, ignore_errors=True)
    written = []
    for p in notebooks(Path(nbs_path)):
        nb, (n_sol, n_test) = student_nb(p, cfg.lib_name)
        dest = out / p.relative_to(nbs_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        nb.pop("path_", None)
        write_nb(nb, dest)
        written.append(dest)
        if not quiet and (n_sol or n_test):
            print(f"{p.relative_to(nbs_path)}: {n_sol} solution cell(s), test lines in {n_test} cell(s) removed")
    if not quiet: print(f"student edition: {len(written)} notebooks in {out}/")
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="_student", help="where to write it (default: _student/)")
    a = ap.parse_args()
    build(Path(a.folder))


if __name__ == "__main__":
    main()
