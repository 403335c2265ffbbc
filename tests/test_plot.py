"""streamnb.plot: what is drawn (bars, waits, arrows, markers, labels), never pixels."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
import torch

from streamnb.graph import GraphBuilder, streams
from streamnb.plot import MARKS, plot_memory, plot_timeline, time_unit
from streamnb.simulator import simulate

aten = torch.ops.aten
REC, WAIT = streams.record_event.default, streams.wait_event.default


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def gids(fig, prefix):
    return sorted(a.get_gid() for ax in fig.axes for a in ax.get_children() if (a.get_gid() or "").startswith(prefix))


def graph(synced, host_sync=False, remedy=None):
    b = GraphBuilder()
    x = b.input("x")
    p = b.op(aten.mul.Tensor, x, x, stream=1, name="p")
    if synced:
        b.sync(REC, 3, 1); b.sync(WAIT, 3, 0)
    c = b.op(aten.add.Tensor, p, x, stream=0, name="c")
    if remedy == "record_stream":
        b.sync(streams.record_stream.default, p, 0)
    if remedy == "sync_dealloc":
        b.sync(REC, 4, 0); b.sync(streams.sync_dealloc.default, 4, 1, p)
    if host_sync:
        b.sync(streams.synchronize_stream.default, 0)
    d = b.op(aten.neg.default, c, stream=2, name="d")
    return b.output(d)


COST = {"p": 0.003, "c": 0.001, "d": 0.002}   # ms: 3, 1, 2 µs


def test_one_bar_per_kernel_and_rows_per_stream():
    tl = simulate(graph(False), cost=COST)
    fig = plot_timeline(tl, titles=["racy"])
    (ax,) = fig.axes
    assert gids(fig, "kernel:") == ["kernel:c", "kernel:d", "kernel:p"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["stream 0 (current)", "stream 1", "stream 2"]
    assert ax.get_title(loc="left") == "racy (makespan 3 µs)"
    assert gids(fig, "wait:") == [] and gids(fig, "flow:") == []
    # the racy readers are outlined in red, the others not
    red = sorted(p.get_gid() for p in ax.patches if tuple(p.get_edgecolor()[:3]) == (1.0, 0.0, 0.0))
    assert red == sorted(f"kernel:{r.consumer}" for r in tl.unordered_reads) == ["kernel:c", "kernel:d"]


def test_waits_arrows_and_host_row():
    tl = simulate(graph(True, host_sync=True), cost=COST)
    fig = plot_timeline(tl)
    (ax,) = fig.axes
    assert gids(fig, "wait:") == ["wait:synchronize_stream_default", "wait:wait_event_default"]
    arrows = [t for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert [a.get_gid() for a in arrows] == ["flow:3"]
    assert arrows[0].xy == (3.0, 1) and arrows[0].xyann == (3.0, 2)   # record on stream 1 -> wait on stream 0
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "host"


def test_markers_for_remedies():
    fig = plot_timeline(simulate(graph(True, remedy="record_stream"), cost=COST))
    assert gids(fig, "record_stream:") == ["record_stream:record_stream_default"]
    fig = plot_timeline(simulate(graph(True, remedy="sync_dealloc"), cost=COST))
    assert gids(fig, "sync_dealloc:") == ["sync_dealloc:sync_dealloc_default"]
    assert gids(fig, "flow:") == ["flow:3", "flow:4"]
    fig = plot_timeline(simulate(graph(True), cost=COST))
    assert gids(fig, "unsafe_free:") == ["unsafe_free:c", "unsafe_free:p"]   # c is read on stream 2 unordered too


def test_stacked_timelines_share_the_time_axis():
    tls = [simulate(graph(s), cost=COST, name=n) for s, n in ((False, "before"), (True, "after"))]
    fig = plot_timeline(*tls)
    assert len(fig.axes) == 2
    assert [a.get_title(loc="left") for a in fig.axes] == ["before (makespan 3 µs)", "after (makespan 4 µs)"]   # d (stream 2) is still unsynced
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()
    assert len(gids(fig, "kernel:")) == 6
    fig2, axes = plt.subplots(2, 1)
    assert plot_timeline(*tls, ax=axes) is fig2
    with pytest.raises(ValueError):
        plot_timeline(*tls, ax=axes[0])


def test_labels_only_where_they_fit():
    b = GraphBuilder()
    x = b.input("x")
    b.op(aten.neg.default, x, stream=0, name="a_very_long_kernel_name")
    b.op(aten.neg.default, x, stream=0, name="wide")
    tl = simulate(b.output(), cost={"a_very_long_kernel_name": 0.00001, "wide": 0.01})
    fig = plot_timeline(tl)
    assert gids(fig, "label:") == ["label:wide"]
    fig = plot_timeline(tl, label={"a_very_long_kernel_name"})   # named: labelled anyway, just above its bar
    assert gids(fig, "label:") == ["label:a_very_long_kernel_name", "label:wide"]
    text = artist(fig, "label:a_very_long_kernel_name")
    assert text.get_va() == "bottom" and text.get_position()[1] < 0   # above row 0 (the y axis points down)
    with pytest.raises(ValueError, match="label: nope: no such kernel"):   # a misspelt name is not silently unlabelled
        plot_timeline(tl, label={"wide", "nope"})


def test_a_long_title_is_wrapped_inside_the_figure():
    "A title longer than its panel is broken into lines (never cut at the figure's edge); the makespan stays whole."
    tl = simulate(graph(True), cost=COST)
    long = "the seed's passes and streamnb's give " + ", ".join(f"kernel_{i}" for i in range(14))
    ms = f"(makespan {tl.makespan * 1e3:.4g} µs)"
    for width in (6, 10):
        fig = plot_timeline(tl, tl, titles=[long, "short"], width=width)
        fig.canvas.draw()
        title = fig.axes[0].get_title(loc="left")
        assert "\n" in title and title.replace("\n", " ") == f"{long} {ms}" and title.endswith(ms)
        shown = next(t for t in fig.axes[0].get_children() if hasattr(t, "get_text") and t.get_text() == title)
        assert shown.get_window_extent().x1 <= fig.bbox.x1, f"width {width}: the title runs off the figure"
        assert fig.axes[1].get_title(loc="left") == f"short {ms}"
        plt.close(fig)


def test_racing_outlines_what_the_sanitizer_found_per_panel():
    tl = simulate(graph(True), cost=COST)
    fig = plot_timeline(tl, tl, racing=[{"c"}, ()], marks={"races"})
    bar0, bar1 = artist(fig, "kernel:c", 0), artist(fig, "kernel:c", 1)
    assert bar0.get_edgecolor()[:3] == (1.0, 0.0, 0.0) and bar0.get_linestyle() == "--"
    assert bar1.get_edgecolor()[:3] != (1.0, 0.0, 0.0)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["unordered read", "race (sanitizer)"]   # d reads p unordered
    fig = plot_timeline(tl, racing=[{"c"}], marks={"waits"})        # "races" not drawn: no outline, no legend entry
    assert artist(fig, "kernel:c").get_edgecolor()[:3] != (1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="1 timelines but 2 entries in racing"):
        plot_timeline(tl, racing=[{"c"}, {"c"}])


def test_plot_memory():
    tls = [simulate(graph(True, remedy=r), cost=COST, name=str(r)) for r in (None, "record_stream", "sync_dealloc")]
    fig = plot_memory(*tls, labels=["none", "rs", "sd"])
    (ax,) = fig.axes
    assert gids(fig, "memory:") == ["memory:none", "memory:rs", "memory:sd"]
    assert gids(fig, "peak:") == ["peak:none", "peak:rs", "peak:sd"]
    for tl, lab in zip(tls, ["none", "rs", "sd"]):
        (peak,) = [l for l in ax.lines if l.get_gid() == f"peak:{lab}"]
        assert peak.get_ydata()[0] == tl.peak_memory       # bytes (small tensors)
        (line,) = [l for l in ax.lines if l.get_gid() == f"memory:{lab}"]
        assert list(line.get_ydata()[:-1]) == [b for _, b in tl.memory]
    assert ax.get_ylabel() == "held (B)"   # not torch.cuda.memory_allocated(): blocks held until reusable, in GPU time
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == f"none (peak {tls[0].peak_memory} B)"


def artist(fig, gid, panel=0):
    return next(a for a in fig.axes[panel].get_children() if a.get_gid() == gid)


def test_one_unit_microseconds():
    assert time_unit(5.0) == time_unit(0.001) == ("µs", 1000.0)
    tl = simulate(graph(True), cost={"p": 3.0, "c": 1.0, "d": 2.0})   # long kernels: still µs
    fig = plot_timeline(tl, titles=["t"])
    assert fig.axes[0].get_xlabel() == "time (µs)" and fig.axes[0].get_title(loc="left") == "t (makespan 4000 µs)"
    bar = artist(fig, "kernel:p")
    assert (bar.get_x(), bar.get_width()) == pytest.approx((0.0, 3000.0))
    fig = plot_memory(tl)
    assert fig.axes[0].get_xlabel() == "time (µs)"


def test_marks_select_what_is_drawn_and_the_legend():
    tl = simulate(graph(True, remedy="sync_dealloc"), cost=COST)
    assert tl.unordered_reads   # d (stream 2) is unsynced
    fig = plot_timeline(tl, marks={"waits"})
    assert gids(fig, "wait:") and not gids(fig, "flow:") and not gids(fig, "sync_dealloc:") and not gids(fig, "unsafe_free:")
    red = [p for p in fig.axes[0].patches if tuple(p.get_edgecolor()[:3]) == (1.0, 0.0, 0.0)]
    assert red == []                                        # races not asked for: no red outline
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["wait"]
    fig = plot_timeline(tl, marks=[])
    assert not fig.legends and len(gids(fig, "kernel:")) == 3 and not gids(fig, "wait:")
    fig = plot_timeline(tl)                                 # None: everything, legend only for what occurs
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts == ["unordered read", "wait", "record → wait", "sync_dealloc", "unsafe free"]
    with pytest.raises(ValueError, match="unknown marks"):
        plot_timeline(tl, marks={"stars"})
    assert set(MARKS) == {"waits", "flows", "races", "unsafe_frees", "record_stream", "syncs"}


def test_record_stream_marker_unclipped_and_its_deferred_free():
    "record_stream issued before its stream ran anything sits at t=0: fully visible; the free it defers is drawn where it happens."
    b = GraphBuilder(shape=(64, 64))
    x = b.input("x")
    t = b.op(aten.mul.Tensor, x, x, stream=0, name="t")
    b.sync(streams.record_stream.default, t, 1)             # at t=0: stream 1 has done nothing yet
    b.sync(REC, 3, 0); b.sync(WAIT, 3, 1)
    b.op(aten.neg.default, t, stream=1, name="r")
    b.op(aten.sin.default, x, stream=0, name="u")
    tl = simulate(b.output(), cost={"t": 0.001, "r": 0.004, "u": 0.002})
    fig = plot_timeline(tl, marks={"record_stream"})
    ax = fig.axes[0]
    mark = artist(fig, "record_stream:record_stream_default")
    assert mark.get_xdata()[0] == 0.0 and not mark.get_clip_on()
    assert ax.get_xlim()[0] < 0.0                           # a margin left of t=0
    freed = artist(fig, "deferred_free:t")
    assert tl.lifetimes["t"].free * 1e3 == pytest.approx(5.0) == pytest.approx(tl.spans["r"][2] * 1e3)
    assert freed.get_xdata()[0] == pytest.approx(5.0)        # the end of r, not t's last use on stream 0 (1 µs)
    assert freed.get_ydata()[0] == pytest.approx(0 - 0.42)   # on stream 0's row: the tensor's own pool
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["record_stream", "its deferred free"]


def test_unsafe_free_star_where_the_block_returns():
    tl = simulate(graph(True), cost=COST)
    fig = plot_timeline(tl, marks={"unsafe_frees"})
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    for u in tl.unsafe_frees:
        star = artist(fig, f"unsafe_free:{u.tensor}")
        assert star.get_xdata()[0] == pytest.approx(u.freed_at * 1e3)
        assert star.get_ydata()[0] == pytest.approx(rows.index(f"stream {u.stream}" + (" (current)" if u.stream == 0 else "")) + 0.42)
