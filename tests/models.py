"""Small models with stream annotations, shared by the tests and the capture and CUDA chapters.

Every model is tiny (CPU, milliseconds) and marks its regions with `torch.fx.traceback.annotate({"stream": i})`.
Stream 0 and unannotated code are the default stream; side streams are 1, 2, ...
`make_model(name)` gives a seeded instance and its inputs for each model in `MODELS`.
"""
import functools

import torch
import torch.nn as nn

# The explain chapter's demo model and its annotation helper (one definition, in the library); made small below.
from streamnb.explain import TransformerBlock, on_stream


class TwoBranchMLP(nn.Module):
    "Two independent branches on side streams 1 and 2, joined on the default stream."
    def __init__(self, d=8, h=16):
        super().__init__()
        self.a1, self.a2 = nn.Linear(d, h), nn.Linear(h, d)
        self.b1, self.b2 = nn.Linear(d, h), nn.Linear(h, d)
        self.head = nn.Linear(d, 4)

    def forward(self, x):
        with on_stream(1): left = self.a2(torch.relu(self.a1(x)))
        with on_stream(2): right = self.b2(torch.tanh(self.b1(x)))
        return self.head(left + right)


class SideStreamConsumer(nn.Module):
    """The record_stream problem: `act` is made on the default stream and last used on side stream 1, so its
    memory must not be reused by the default stream before the side stream is done with it."""
    def __init__(self, d=8):
        super().__init__()
        self.inp, self.side, self.out = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        act = torch.relu(self.inp(x))                      # default stream
        main = self.out(act)                               # default stream, an earlier use
        with on_stream(1): side = torch.sigmoid(self.side(act)) * act   # last use of act: stream 1
        return main + side


class NoStreams(nn.Module):
    "A plain MLP with no stream annotation at all: capture works, and says there is nothing to do."
    def __init__(self, d=8):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))

    def forward(self, x):
        return self.net(x)


def two_stream_fn(x, w):
    "A plain function (no module): matmul on stream 1, pointwise on stream 2; `x` is used on both."
    with on_stream(1): a = torch.relu(x @ w)
    with on_stream(2): b = torch.tanh(x * 2)
    return (a + b).sum(dim=0)


MODELS = {
    "two_branch_mlp": (TwoBranchMLP, (2, 8)),
    # pre-norm block, attention on stream 1 and the MLP on stream 2: x's grad is accumulated from two streams
    "transformer_block": (functools.partial(TransformerBlock, d=8, heads=2, hidden=16), (2, 3, 8)),
    "side_stream_consumer": (SideStreamConsumer, (2, 8)),
    "no_streams": (NoStreams, (2, 8)),
}
STREAM_MODELS = [k for k in MODELS if k != "no_streams"]


def make_model(name, seed=0):
    "A seeded instance of the model `name` and its example inputs (one input that requires grad)."
    make, shape = MODELS[name]
    torch.manual_seed(seed)
    model = make()
    x = torch.randn(*shape, requires_grad=True)
    return model, (x,)
