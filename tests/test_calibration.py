"""Tests of streamnb.calibration (chapter 22): the published table, the engine's graph, the agreement measures, the
models' structure. The full comparison (four captured CNNs, a couple of minutes on a CPU) runs in the chapter itself."""
import operator

import pytest
import torch
from torch import nn

from streamnb.calibration import (IOS_MODELS, IOS_V100, Fire, NASNetLarge, RandStage, SqueezeNetBypass, capture_ios_model,
                                  engine_view, inference_graph, kendall_tau, mean_relative_error, predict, ws_dag)
from streamnb.capturing import capture
from streamnb.cost import calibrated, get_device_spec
from streamnb.graph import StreamnbError

aten = torch.ops.aten


def test_published_speedups_are_the_ones_the_issue_quotes():
    speedups = {m: round(seq / par, 2) for m, (seq, par) in IOS_V100.items()}
    assert speedups == {"inception_v3": 1.58, "randwire": 1.41, "nasnet": 1.43, "squeezenet": 1.05}
    assert set(IOS_MODELS) == set(IOS_V100)


def test_kendall_tau_and_error_by_hand():
    # pairs of (1, 3, 2, 4) against (1, 2, 3, 4): five concordant, one discordant (3 > 2 reversed): (5 - 1) / 6
    assert kendall_tau([1, 3, 2, 4], [1, 2, 3, 4]) == pytest.approx(4 / 6)
    assert kendall_tau([2, 1], [1, 2]) == -1.0
    assert kendall_tau([1, 1], [1, 2]) == 0.0                     # a tie counts as neither
    assert mean_relative_error([1.2, 0.5], [1.0, 1.0]) == pytest.approx((0.2 + 0.5) / 2)
    with pytest.raises(StreamnbError, match="same length"):
        kendall_tau([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        mean_relative_error([1.0], [1.0, 2.0])


class ConvBnRelu(nn.Module):
    "conv-bn-relu, then a ReLU of a sum (a pre-activation, which no convolution can absorb)."
    def __init__(self):
        super().__init__()
        self.c = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU())
    def forward(self, x): return torch.relu(self.c(x) + x)


def kernels(gm):
    return sorted(str(getattr(n.target, "overloadpacket", n.target)).split(".")[-1] for n in gm.graph.nodes
                  if n.op == "call_function" and n.target is not operator.getitem)


def test_engine_view_folds_batchnorm_and_the_convolutions_relu_only():
    cap = capture(ConvBnRelu().eval(), torch.randn(1, 4, 8, 8), frontend="aot")
    gm = inference_graph(cap)
    before = kernels(gm)
    assert before.count("relu") == 2 and "_native_batch_norm_legit_no_training" in before
    assert kernels(engine_view(gm)) == ["add", "convolution", "relu"]   # the ReLU after the add stays
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    assert len(outputs) == cap.num_fwd_outputs == 1                     # no tensors saved for backward
    with pytest.raises(TypeError, match="cap: expected a Capture"):
        inference_graph(gm)


def test_fire_module_has_its_bypass_only_when_channels_change():
    assert isinstance(Fire(128, 16, 64).bypass, nn.Identity)
    assert isinstance(Fire(96, 16, 64).bypass, nn.Sequential)
    assert SqueezeNetBypass().eval()(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_random_graphs_are_seeded_dags():
    edges = ws_dag(32, 4, 0.75, 3)
    assert edges == ws_dag(32, 4, 0.75, 3) != ws_dag(32, 4, 0.75, 4)
    assert all(a < b for a, b in edges) and len(edges) == len(set(edges))
    assert ws_dag(6, 2, 0.0, 0) == [(0, 1), (0, 5), (1, 2), (2, 3), (3, 4), (4, 5)]   # p = 0: the ring
    stage = RandStage(3, 8, 8, seed=1)
    assert stage(torch.randn(1, 3, 16, 16)).shape == (1, 8, 8, 8)        # input nodes stride 2


def test_nasnet_cells_follow_ios_channel_counts():
    cells = NASNetLarge().cells
    assert [c.kind for c in cells[:4]] == ["reduction", "reduction", "first", "normal"]
    assert len(cells) == 2 + 3 * 6 + 2
    # f = 168: stems 4·42 and 4·84; first 6f, normal 5f; reduction 4·2f, first 6·2f, ...; the last normal 5·4f
    assert [cells[i].out_channels for i in (0, 1, 2, 3, 8, 9, 10, 15, 21)] == [168, 336, 1008, 840, 1344, 2016, 1680,
                                                                                  2688, 3360]


def test_unknown_model_is_refused():
    with pytest.raises(StreamnbError, match="unknown model 'vgg'"):
        capture_ios_model("vgg")


def test_predict_on_two_independent_convolutions():
    # Two independent 1×1 convolutions: one stream takes both in turn, two streams overlap them; the prediction's
    # speedup is the ratio of the two simulated makespans, and the ideal model predicts a smaller one.
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(1280, 320, 1, bias=False), nn.Conv2d(1280, 320, 1, bias=False)
        def forward(self, x): return self.a(x), self.b(x)
    gm = engine_view(inference_graph(capture(Two().eval(), torch.randn(1, 1280, 8, 8), frontend="aot")))
    p = predict(gm, "V100", side_streams=1)
    assert p.kernels == 2 and p.streams_ms < p.single_ms
    assert 1.7 < p.speedup <= 2.0
    assert predict(gm, get_device_spec("V100"), side_streams=1).speedup < p.speedup
    assert predict(gm, calibrated("V100"), side_streams=1) == p


def test_host_costs_reproduce_the_blog():
    """The calibrated host costs give the cited measurements (NVIDIA, 'Getting Started with CUDA Graphs'): 3.8 µs per
    trivial kernel launched back to back, 9.6 µs with a synchronize after each (launch, kernel and wake-up together)."""
    from streamnb.cost import calibrated
    from streamnb.graph import GraphBuilder, aten, streams
    from streamnb.simulator import simulate

    def loop(n, sync):
        b = GraphBuilder(shape=(16,))
        y = b.input("x")
        for _ in range(n):
            y = b.op(aten.add.Tensor, y, 1.0, stream=0)
            if sync: b.sync(streams.synchronize_stream.default, 0)
        return b.output(y)

    for dev in ("V100", "H100"):
        spec = calibrated(dev)
        assert spec.host_op_us > 0                      # a stream op costs the host an API call
        for sync, want in ((False, 3.8), (True, 9.6)):
            t1, t2 = (simulate(loop(n, sync), device=spec).makespan for n in (50, 100))
            assert (t2 - t1) / 50 * 1e3 == pytest.approx(want, abs=0.05), (dev, sync)
