"""One pytest test per notebook, so that a broken notebook fails pytest too (CPU cells only). These are the notebooks
`nbdev_test` runs, with its skip flags; `tools/test.sh` relies on this and runs no separate `nbdev_test`."""
import pytest
from nbdev.config import get_config
from nbdev.doclinks import nbglob
import nbdev.test as nbtest  # not `from nbdev.test import test_nb`: pytest would collect it

_cfg = get_config()
_nbs = sorted(nbglob(as_path=True))   # nbdev_test's own search: nbs_path, recursive, `_`/`.` names skipped


@pytest.mark.parametrize("nb", _nbs, ids=[p.name for p in _nbs])
def test_notebook(nb):
    ok, _ = nbtest.test_nb(nb.absolute(), skip_flags=_cfg.tst_flags.split(), basepath=_cfg.config_path)
    assert ok, f"{nb.name} failed"
