#!/usr/bin/env bash
# The test command: library in sync with the notebooks, every notebook's CPU cells, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export MPLBACKEND=Agg
bash tools/check_sync.sh
nbdev_test --n_workers 0
pytest -q -p no:cacheprovider
