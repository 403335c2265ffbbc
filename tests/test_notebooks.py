"""One pytest test per notebook, so that a broken notebook fails pytest too (CPU cells only)."""
from pathlib import Path

import pytest
from nbdev.config import get_config
import nbdev.test as nbtest  # not `from nbdev.test import test_nb`: pytest would collect it

_cfg = get_config()
_nbs = sorted(p for p in Path(_cfg.nbs_path).glob("*.ipynb") if not p.name.startswith("_"))


@pytest.mark.parametrize("nb", _nbs, ids=[p.name for p in _nbs])
def test_notebook(nb):
    ok, _ = nbtest.test_nb(nb.absolute(), skip_flags=_cfg.tst_flags.split(), basepath=_cfg.config_path)
    assert ok, f"{nb.name} failed"
