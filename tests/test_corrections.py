"""The corrections registry (`streamnb.graph.CORRECTIONS`) is the one list of where streamnb departs from the seed.

Checked against it: the README's table is the registry's (`corrections_table()`), every correction names code that
exists, the numbers run 1..N, and every correction has its tests (`test_correction_<n>_...`)."""
import importlib
import re
from pathlib import Path

import streamnb  # noqa: F401  (imports every pass module, so every correction is registered)
from streamnb.graph import CORRECTIONS, corrections_table

ROOT = Path(__file__).resolve().parent.parent


RESERVED = {29, 30}   # issue 45/46's core corrections, made on a branch of their own (holds with or without them)


def test_numbers_run_from_one():
    numbers = sorted(set(CORRECTIONS) | RESERVED)
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(CORRECTIONS) >= 11


def test_each_correction_names_code_that_exists():
    for c in CORRECTIONS.values():
        module, _, qualname = c.where.partition(".")[2].partition(".")   # streamnb.<module>.<qualname>
        obj = importlib.import_module(f"streamnb.{module}")
        for part in qualname.split("."): obj = getattr(obj, part)
        assert callable(obj), c
        assert any((ROOT / "nbs").glob(f"{c.chapter}*.ipynb")), c


def test_each_correction_has_tests():
    names = set()
    for f in (ROOT / "tests").glob("test_*.py"):
        names |= {int(n) for n in re.findall(r"^def test_correction_(\d+)_", f.read_text(), re.MULTILINE)}
    assert set(CORRECTIONS) <= names, f"corrections without a test_correction_<n>_ test: {set(CORRECTIONS) - names}"


def test_readme_table_is_the_registry():
    readme = (ROOT / "README.md").read_text()
    assert corrections_table() in readme, "README's corrections table is not the registry's: re-run nbs/index.ipynb"


def test_a_correction_run_again_outside_the_package_keeps_the_packages_entry():
    # a notebook or a docs tool that runs an export cell again in-process defines the corrected method anew, in a
    # module that is not the package's: the registry keeps naming the package's code (found with pytest -n 2)
    from streamnb.graph import correction
    before = CORRECTIONS[22]
    def again(): pass
    again.__module__, again.__qualname__ = "streamnb", before.where.split(".", 2)[2]
    correction(22, before.chapter, before.seed, before.fix)(again)
    assert CORRECTIONS[22] == before
