"Tests of streamnb.cost: the seed's estimate against torch's own, hand-computed values, free ops, errors."
from unittest import mock

import pytest
import torch
import torch.fx as fx

import torch._functorch._aot_autograd.streams as torch_streams
import torch.utils._runtime_estimation as rt
from streamnb.cost import DEVICE_SPECS, DeviceSpec, get_device_spec, get_roofline_estimate, is_free_op, val_nodes
from streamnb.graph import GraphBuilder, MissingValError, StreamnbError

aten = torch.ops.aten
TOY = DeviceSpec("toy", 100.0, 100.0, 100.0, 100.0, 100.0, hbm_gbps=1000.0, source="test constants")


def _node(g, target, args, value, kwargs=None):
    n = g.call_function(target, args, kwargs or {})
    if value is not None: n.meta["value"] = value
    return n


def _value_graph():
    "Nodes whose meta['value'] holds real CPU tensors, as the seed's estimate needs; targets both packets and overloads."
    torch.manual_seed(0)
    g = fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    a.meta["value"], b.meta["value"], c.meta["value"] = torch.randn(64, 32), torch.randn(32, 16), torch.randn(64, 16)
    A, B, C = a.meta["value"], b.meta["value"], c.meta["value"]
    bm = g.placeholder("bm"); bm.meta["value"] = torch.randn(3, 8, 5)
    bn = g.placeholder("bn"); bn.meta["value"] = torch.randn(3, 5, 7)
    h = g.placeholder("h"); h.meta["value"] = torch.randn(8, 8, dtype=torch.float16)
    nodes = [
        _node(g, aten.mm, (a, b), A @ B),                       # packet: FLOPs found, compute term
        _node(g, aten.mm.default, (a, b), A @ B),               # overload: lookup misses, bytes only
        _node(g, aten.addmm, (c, a, b), C + A @ B),
        _node(g, aten.bmm, (bm, bn), bm.meta["value"] @ bn.meta["value"]),
        _node(g, aten.mm, (h, h), h.meta["value"] @ h.meta["value"]),
        _node(g, aten.add.Tensor, (a, a), A + A),
        _node(g, aten.mul.Tensor, (c, 2.0), C * 2),
        _node(g, aten.view, (a, [-1]), A.view(-1)),              # packet in _IGNORE_OPS
        _node(g, aten.view.default, (a, [-1]), A.view(-1)),      # overload: not ignored
        _node(g, aten.expand.default, (c, [4, 64, 16]), C.expand(4, 64, 16)),   # stride-0 dims count once
        _node(g, aten.sum.dim_IntList, (a, [0]), A.sum(0)),
        _node(g, aten.var_mean.correction, (a,), torch.var_mean(A)),   # tuple output
        _node(g, aten.argmax.default, (a,), A.argmax()),          # integer output
        _node(g, aten.mm.default, (a, b), None),                  # no meta["value"]: reads only
    ]
    return nodes


@pytest.mark.parametrize("tflops,gbps", [(100.0, 1000.0), (989.4, 3350.0), (19.5, 2039.0), (0.01, 1000.0)])
def test_upstream_equals_torch_bit_for_bit(tflops, gbps):
    spec = DeviceSpec("x", tflops, tflops, tflops, tflops, tflops, hbm_gbps=gbps, source="test")
    nodes = _value_graph()
    with mock.patch.object(rt, "get_gpu_dram_gbps", lambda: gbps), \
         mock.patch.object(rt, "get_device_tflops", lambda dtype: tflops):
        theirs = [torch_streams.get_roofline_estimate(n) for n in nodes]
    ours = [get_roofline_estimate(n, upstream=True, device=spec) for n in nodes]
    assert ours == theirs                      # exact float equality
    assert theirs[0] >= theirs[1] > 0          # the packet mm has a compute term, the overload only bytes
    if tflops < 1: assert theirs[0] > theirs[1]   # a slow enough device makes the compute term win
    assert theirs[7] == 0.0 and theirs[8] > 0 and 0 < theirs[-1] < theirs[1]   # no value: its write is not counted


def test_upstream_is_zero_on_a_real_graph():
    b = GraphBuilder(dtype=torch.bfloat16, shape=(512, 512))
    x, w = b.input("x"), b.input("w")
    mm = b.op(aten.mm.default, x, w)
    add = b.op(aten.add.Tensor, mm, x)
    b.output(add)
    assert [get_roofline_estimate(n, upstream=True) for n in (mm, add)] == [0.0, 0.0]
    assert get_roofline_estimate(mm) > 0 and get_roofline_estimate(add) > 0


@pytest.mark.parametrize("device", ["H100", "H200", "A100"])
@pytest.mark.parametrize("m,k,n", [(4096, 4096, 4096), (8192, 1024, 2048)])
def test_mm_is_compute_bound_and_counts_2mnk(device, m, k, n):
    spec = DEVICE_SPECS[device]
    b = GraphBuilder(dtype=torch.bfloat16)
    x, w = b.input("x", shape=(m, k)), b.input("w", shape=(k, n))
    mm = b.op(aten.mm.default, x, w)
    expected_compute = 2 * m * n * k / (0.75 * spec.bf16_tflops * 1e12) * 1e3
    expected_bytes = 2 * (m * k + k * n + m * n) / (spec.hbm_gbps * 1e9) * 1e3
    assert expected_compute > expected_bytes
    assert get_roofline_estimate(mm, device=device) == pytest.approx(expected_compute, rel=1e-12)
    assert get_roofline_estimate(mm, device=device, efficiency=0.5) == pytest.approx(expected_compute * 1.5, rel=1e-12)


def test_fp32_matmul_uses_cuda_cores_unless_tf32():
    b = GraphBuilder(dtype=torch.float32, shape=(2048, 2048))
    x = b.input("x")
    mm = b.op(aten.mm.default, x, x)
    flops = 2 * 2048**3
    assert get_roofline_estimate(mm) == pytest.approx(flops / (0.75 * 66.9e12) * 1e3, rel=1e-12)
    assert get_roofline_estimate(mm, tf32=True) == pytest.approx(flops / (0.75 * 494.7e12) * 1e3, rel=1e-12)


def test_elementwise_bytes():
    b = GraphBuilder(dtype=torch.float16, shape=(1000, 300))
    x, y = b.input("x"), b.input("y")
    add = b.op(aten.add.Tensor, x, y)
    sq = b.op(aten.mul.Tensor, x, x)                     # x read once
    row = b.input("row", shape=(1, 300))
    bc = b.op(aten.expand.default, row, [1000, 300])     # a view: free
    cast = b.op(aten._to_copy.default, x, dtype=torch.float32)
    el = 1000 * 300
    bw = DEVICE_SPECS["H100"].hbm_gbps * 1e9
    assert get_roofline_estimate(add) == pytest.approx(3 * 2 * el / bw * 1e3, rel=1e-12)
    assert get_roofline_estimate(sq) == pytest.approx(2 * 2 * el / bw * 1e3, rel=1e-12)
    assert get_roofline_estimate(bc) == 0.0
    assert get_roofline_estimate(cast) == pytest.approx((2 + 4) * el / bw * 1e3, rel=1e-12)


def test_free_ops():
    b = GraphBuilder()
    x = b.input("x")
    v = b.op(aten.view.default, x, [-1])
    t = b.op(aten.t.default, x)
    z = b.op(aten.zeros_like.default, x)
    ev = b.sync(torch.ops.streams.record_event.default, 3, 1, tag="must_be_in_backward")
    neg = b.op(aten.neg.default, x)
    for n in (v, t, z, ev):
        assert is_free_op(n) and get_roofline_estimate(n) == 0.0 and val_nodes(n) == []
    assert not is_free_op(neg) and val_nodes(neg) == [neg, x]


def test_errors():
    b = GraphBuilder()
    x = b.input("x")
    neg = b.op(aten.neg.default, x, name="neg")
    with pytest.raises(AssertionError, match="non-func node"):
        get_roofline_estimate(x, upstream=True)
    with pytest.raises(StreamnbError, match="node x: only call_function"):
        get_roofline_estimate(x)
    with pytest.raises(StreamnbError, match="known devices: H100, H200, A100"):
        get_roofline_estimate(neg, device="TPU")
    with pytest.raises(StreamnbError, match="fixed 75%"):
        get_roofline_estimate(neg, upstream=True, efficiency=0.5)
    with pytest.raises(StreamnbError, match="efficiency"):
        get_roofline_estimate(neg, efficiency=0)
    del neg.meta["val"]
    with pytest.raises(MissingValError, match="node neg"):
        get_roofline_estimate(neg)
    assert get_device_spec(TOY) is TOY


def test_spec_table_is_dense_and_sourced():
    for s in DEVICE_SPECS.values():
        assert s.source.startswith("https://") and s.sm_count > 0
        assert s.ideal                                  # the table's rows are the ideal model; `calibrated` adds the rest
        if s.name == "V100":                            # Volta: no TF32 or BF16 tensor cores, they run at the FP32 rate
            assert s.tf32_tflops == s.bf16_tflops == s.fp32_tflops
        else:                                           # dense tensor-core ratios of Ampere/Ada/Hopper (L4: 60 and 121)
            assert abs(s.tf32_tflops - s.bf16_tflops / 2) <= 0.01 * s.bf16_tflops
    assert DEVICE_SPECS["H100"].bf16_tflops < 1000    # not the 1979 "with sparsity" figure


def test_calibrated_devices_change_only_the_named_fields_each_with_a_source():
    import dataclasses
    from streamnb.cost import CALIBRATION, _REALISM, calibrated
    assert set(CALIBRATION) == set(_REALISM)
    assert all(len(src) > 20 for _, src in CALIBRATION.values())
    for name, row in DEVICE_SPECS.items():
        cal = calibrated(name)
        assert not cal.ideal and dataclasses.replace(cal, **{f: getattr(row, f) for f in _REALISM}) == row
    assert calibrated("V100").conv_tf32 is False and calibrated("H100").conv_tf32 is True   # Volta has no TF32


def test_calibrated_estimate_by_hand():
    # A 1×1 convolution 1280 -> 320 on 8×8, float32, V100: 52,428,800 FLOPs; occupancy 20480 / (80 · 2048) = 0.125;
    # 3 µs + 52428800 / (0.5 · 15.7e12 · 0.125) s. A 4096² bf16 matmul fills an H100: 3 µs + its roofline at 50%.
    from streamnb.cost import calibrated
    b = GraphBuilder()
    x, w = b.input("x", shape=(1, 1280, 8, 8)), b.input("w", shape=(320, 1280, 1, 1))
    conv = b.op(aten.convolution.default, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    assert get_roofline_estimate(conv, device=calibrated("V100")) == pytest.approx(3e-3 + 52428800 / (0.5 * 15.7e12 * 0.125) * 1e3)
    bb = GraphBuilder(dtype=torch.bfloat16, shape=(4096, 4096))
    mm = bb.op(aten.mm.default, bb.input("a"), bb.input("b"))
    assert get_roofline_estimate(mm, device=calibrated("H100")) == pytest.approx(3e-3 + 2 * 4096**3 / (0.5 * 989.4e12) * 1e3)
    # upstream=True takes the seed's fixed 75% whatever the device says (no refusal); on a real graph it is 0, as always
    assert get_roofline_estimate(mm, upstream=True, device=calibrated("H100")) == 0.0
