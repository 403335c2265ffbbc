"""The primer's eager-to-graph table (chapter 00) against torch 2.13's dynamo: each row's eager call is traced with
`streamnb.capture` (on the CPU, where torch.cuda's streams and events stand in) and the stream ops it makes are the
ones the table's middle column names."""
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from streamnb.capturing import capture
from streamnb.graph import get_stream
from streamnb.streamops import check_stream_ops, decode

warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)


def _wait_first(s1):
    s1.wait_stream(torch.cuda.current_stream())   # the input was made on the current stream


def p_stream(x):
    s1 = torch.cuda.Stream(); _wait_first(s1)
    with torch.cuda.stream(s1): a = x * x
    torch.cuda.current_stream().wait_stream(s1)
    return a + 1


def p_current(x):
    torch.cuda.current_stream()
    return x * x


def p_record(x):
    s1 = torch.cuda.Stream(); e = torch.cuda.Event(); _wait_first(s1)
    with torch.cuda.stream(s1):
        a = x * x; e.record()
    e.wait()
    return a + 1


def p_record_stream(x):
    s1 = torch.cuda.Stream(); a = x * x
    a.record_stream(s1)
    return a + 1


def p_event_sync(x):
    e = torch.cuda.Event(); a = x * x
    e.record(); e.synchronize()
    return a + 1


def p_stream_sync(x):
    s1 = torch.cuda.Stream(); a = x * x
    s1.synchronize()
    return a + 1


def p_device_sync(x):
    a = x * x
    torch.cuda.synchronize()
    return a + 1


def p_item(x):
    a = x * x
    return a + a.sum().item()


def p_cpu(x):
    a = x * x
    return a.cpu() + 1


# the table's first column (its start) -> the program, and the stream ops dynamo makes: (kind, args), in order
ROWS = {
    "`s1 = torch.cuda.Stream()`": (p_stream, [("wait_stream", (1, 0)), ("wait_stream", (0, 1))]),
    "`torch.cuda.current_stream()`": (p_current, []),
    "`with torch.cuda.stream(s1): a = x * x`": (p_stream, [("wait_stream", (1, 0)), ("wait_stream", (0, 1))]),
    "`e = torch.cuda.Event(); e.record(s1)`": (p_record, [("wait_stream", (1, 0)), ("record_event", (2, 1)),
                                                          ("wait_event", (2, 0))]),
    "`e.wait(s0)`": (p_record, [("wait_stream", (1, 0)), ("record_event", (2, 1)), ("wait_event", (2, 0))]),
    "`s0.wait_stream(s1)`": (p_stream, [("wait_stream", (1, 0)), ("wait_stream", (0, 1))]),
    "`a.record_stream(s1)`": (p_record_stream, [("record_stream", ("mul", 1))]),
    "`e.synchronize()`": (p_event_sync, [("record_event", (1, 0)), ("synchronize_event", (1,))]),
    "`s1.synchronize()`": (p_stream_sync, [("synchronize_stream", (1,))]),
    "`torch.cuda.synchronize()`": (p_device_sync, [("synchronize_device", ("cuda", 0))]),
    "`a.item()`, `a.cpu()`, `a.tolist()`": ((p_item, p_cpu), []),
}


def table_rows():
    nb = json.loads((Path(__file__).resolve().parent.parent / "nbs" / "00_primer.ipynb").read_text())
    md = next("".join(c["source"]) for c in nb["cells"] if "| eager PyTorch | in the graph | blocks |" in "".join(c["source"]))
    return [line.split(" | ")[0].lstrip("| ").strip() for line in md.splitlines()
            if line.startswith("| `") and "|---" not in line]


def test_every_row_of_the_table_is_traced():
    rows = table_rows()
    assert len(rows) == 11, rows
    assert all(any(r.startswith(k) for k in ROWS) for r in rows), [r for r in rows if not any(r.startswith(k) for k in ROWS)]


def _ops(f):
    gm = capture(f, torch.randn(8, 8, requires_grad=True)).forward
    check_stream_ops(gm)   # what dynamo makes, torch can run: no index both an event and a stream
    return gm, [(op.kind, tuple(getattr(a, "name", a) for a in op.args)) for n in gm.graph.nodes if (op := decode(n, gm))]


@pytest.mark.parametrize("row", sorted(ROWS))
def test_the_row_matches_what_dynamo_emits(row):
    programs, want = ROWS[row]
    for f in (programs if isinstance(programs, tuple) else (programs,)):
        gm, got = _ops(f)
        assert got == want, (row, got)
        if f is p_stream:   # the `with` block: the node carries the stream as an annotation
            assert [get_stream(n) for n in gm.graph.nodes if n.name == "mul"] == [1]


def test_the_table_names_the_forms_dynamo_emits():
    md = "\n".join(table_rows())
    nb = json.loads((Path(__file__).resolve().parent.parent / "nbs" / "00_primer.ipynb").read_text())
    text = next("".join(c["source"]) for c in nb["cells"] if "| eager PyTorch | in the graph | blocks |" in "".join(c["source"]))
    assert "`synchronize_device('cuda', 0)`" in text and "`synchronize_device()`" not in text
    assert re.search(r"\| `a\.item\(\)`.*\| no stream op", text)
    assert "`record_event(2, 1)`" in text and "`synchronize_event(2)`" in text
