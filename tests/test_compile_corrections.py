"""Correction 14 and the forward `control_deps` tag, end to end through `torch.compile` on the CPU.

A user's forward sync after a LayerNorm (a multi-output op) and a user's chained `wait_stream` joins: both reach
AOTAutograd's partitioner, which the seed's wrap (and PyTorch 2.13's own passes) fail. The compiled graphs run on
streamnb's CPU executor and must give eager's numbers."""
from __future__ import annotations

import pytest
import torch

from test_compile import (assert_eager, compile_and_run, event_joined_block, joined_blocks, two_blocks,
                          two_blocks_inputs)


def test_correction_14_forward_sync_after_layer_norm_compiles():
    "The transformer block with event joins: the default passes compile it and give eager's outputs and gradients."
    model, twin = event_joined_block("cpu")
    xs = (torch.randn(4, 16, 64, requires_grad=True),)
    sw, graphs, out, grads, pgrads = compile_and_run(model, xs, cpu_as="meta")
    assert_eager(twin, xs, out, grads, pgrads)
    fw = graphs["forward"][0]
    ctrls = [n for n in fw.graph.nodes if n.target is torch.ops.higher_order.control_deps]
    assert ctrls and not any(d.target is torch.ops.aten.native_layer_norm.default for c in ctrls for d in c.args[0])


def test_correction_14_the_seed_fails_on_it():
    "`upstream=True` makes the forward record depend on `native_layer_norm` itself: the partitioner refuses it."
    model, _ = event_joined_block("cpu")
    xs = (torch.randn(4, 16, 64, requires_grad=True),)
    with pytest.raises(Exception, match="Expected native_layer_norm.* to be a tensor"):
        compile_and_run(model, xs, cpu_as="meta", upstream=True)


def test_forward_ctrls_stay_in_the_forward():
    """Chained forward `wait_stream` joins (corrections 8 and 11): without the `must_be_in_forward` tag the
    partitioner copies the second join into the backward and saves the first, a tuple without `meta['val']`."""
    xs = two_blocks_inputs()
    sw, graphs, out, grads, _ = compile_and_run(joined_blocks, xs, cpu_as="meta")
    assert_eager(two_blocks, xs, out, grads, {})
    bw = graphs["backward"][0]
    assert all("val" in n.meta for n in bw.graph.nodes if n.op == "placeholder")
    assert not any(n.meta.get("partitioner_tag") == "must_be_in_forward" for n in bw.graph.nodes)
