"""One lint over every notebook and every file: export cells at most 40 lines, a median export cell of at most 10 lines
per notebook, and every `*.md` a file cites exists in the repository.

The notebooks listed in `ALLOWED` are over a limit today; each entry is the notebook's current number, which may only
go down (the test fails when a notebook grows past its entry, and when it is within the limits so that its entry must
go). Split an export cell at its top-level definitions, code unchanged, to bring a notebook down."""
import json
import re
import statistics
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "nbs").glob("*.ipynb"))
MAX_LINES, MAX_MEDIAN = 40, 10

# notebook -> (its longest export cell, its median export cell), where over the limits on 2026-12-07 (issue 44)
ALLOWED: dict[str, tuple[int | None, float | None]] = {}


def export_cells(nb: Path) -> list[int]:
    "The line count of each export cell (`#| export`, `#| exporti`, `#| export course`) of `nb`."
    cells = json.loads(nb.read_text())["cells"]
    srcs = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    return [len(s.splitlines()) for s in srcs if re.match(r"#\|\s*export", s)]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_export_cells_are_small(nb):
    sizes = export_cells(nb)
    if not sizes: return
    longest, median = max(sizes), statistics.median(sizes)
    allowed_longest, allowed_median = ALLOWED.get(nb.stem, (None, None))
    assert longest <= (allowed_longest or MAX_LINES), f"{nb.name}: an export cell of {longest} lines"
    assert median <= (allowed_median or MAX_MEDIAN), f"{nb.name}: median export cell {median} lines"
    if nb.stem in ALLOWED:   # an allowance that is no longer needed must go
        assert (allowed_longest is not None and longest > MAX_LINES) or (allowed_median is not None
                                                                          and median > MAX_MEDIAN), \
            f"{nb.name} is within the limits now: drop it from ALLOWED"


def test_every_cited_markdown_file_exists():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    tracked_md = {Path(f).name for f in files if f.endswith(".md")}
    missing = []
    for f in files:
        if f.startswith("_docs") or not f.endswith((".py", ".ipynb", ".md", ".sh", ".toml", ".ini", ".txt", ".cfg")):
            continue
        text = (ROOT / f).read_text(errors="ignore")
        for cited in set(re.findall(r"(?<![\w/.-])((?:\.\./|[\w-]+/)*[\w-]+\.md)\b", text)):
            here = [p.resolve() for p in (ROOT / cited, (ROOT / f).parent / cited)]
            if not any(p.exists() and p.is_relative_to(ROOT) for p in here) and not ("/" not in cited and cited in tracked_md):
                missing.append((f, cited))
    assert missing == [], f"files cite documents that are not in the repository: {missing}"
