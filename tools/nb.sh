#!/usr/bin/env bash
# Authoring helper: execute notebooks in place (outputs and plots saved), clean them, export the library.
#   bash tools/nb.sh nbs/11_syncs.ipynb [more notebooks...]
# A notebook whose cells carry `#| cuda` must keep them at the end: on a CPU machine execution stops there,
# so this script executes with --allow-errors only for those, and you should check the output.
set -euo pipefail
cd "$(dirname "$0")/.."
# MPLBACKEND must be unset here: with Agg, no figure is saved into the notebook
unset MPLBACKEND
for nb in "$@"; do
  jupyter nbconvert --to notebook --execute --inplace --ExecutePreprocessor.timeout=600 "$nb"
done
nbdev_clean
nbdev_export
