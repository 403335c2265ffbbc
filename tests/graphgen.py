"""Generated backward-like graphs for differential and property tests.

`random_backward_graph(seed, ...)` builds, deterministically per seed, a meta-device `GraphModule` shaped like
the joint graphs AOTAutograd hands to the stream passes:

* placeholders: forward inputs (`primals_i`, tag `is_forward`) and tangents (`tangents_i`, tag `is_backward`);
* optionally a short forward prefix (tag `is_forward`);
* backward ops (elementwise and `mm` on square tensors) on 1-4 streams (indices `0..n_streams-1`), in runs
  on one stream, some unannotated (no `custom`), args biased towards recent values; some values are
  deliberately consumed on several streams (fan-out);
* gradient-accumulation nodes (`add`, `is_gradient_acc`, no stream);
* user-written `record_event(e, s)` after a node on stream `s`, later `wait_event(e, s2)` and
  `synchronize_event(e)` (only for events already recorded; event indices from `USER_EVENTS`, reused when
  more records are made than there are indices);
* optionally epilogue `copy_(primals_i, value)` nodes;
* an output returning every node without users (so nothing is dead) plus a few others.

Every node comes after its producers (they are appended in order). Stream indices (0..3) and user event
indices (4..9) stay below the oracle's counter start (10), as in dynamo's registry, where the user's objects
are registered before the passes allocate theirs.
"""
from __future__ import annotations

import collections
import operator
import random

import torch
from torch.fx import GraphModule

from streamnb.graph import GraphBuilder

aten = torch.ops.aten
streams = torch.ops.streams

USER_EVENTS = tuple(range(4, 10))
UNARY = (aten.neg.default, aten.sin.default, aten.relu.default)
BINARY = (aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.mm.default)
TENSOR_PACKETS = (aten.relu.default, aten.mm.default)   # ops whose packet (aten.relu) has no overload that makes a host value


def random_backward_graph(seed: int, *, n_nodes: int = 30, n_streams: int | None = None, n_primals: int = 2,
                          n_tangents: int = 2, n_forward: int = 0, p_unannotated: float = 0.15,
                          p_acc: float = 0.1, p_fanout: float = 0.1, p_user_sync: float = 0.08,
                          p_copy: float = 0.0, p_stay: float = 0.7, p_consume: float = 0.0, user_sync_tag: str | None = None,
                          shape: tuple = (4, 4), fast: bool = False, p_shared_custom: float = 0.0,
                          p_bad_val: float = 0.0) -> GraphModule:
    """A random backward-like graph, the same for the same arguments.

    `n_nodes` counts the compute nodes (forward prefix, backward ops, accumulations, fan-out consumers);
    sync and copy nodes come on top. `n_streams=None` draws 1..4 from the seed. `p_stay` is the chance that
    the next annotated node stays on the previous node's stream. `p_consume` is the chance that an argument is
    the oldest value nobody reads yet (fewer outputs: with 0, about a quarter of the nodes end up as outputs,
    which makes big graphs output-heavy). `fast=True` gives every compute node one
    shared `meta['val']` instead of running the op on meta tensors (for big benchmark graphs).

    Issue 48's input forms (off by default: the same graphs as before for the same arguments): `p_shared_custom`,
    the chance that a compute node shares its `custom` dict with an earlier node of the same stream (an unannotated
    node or an accumulation: one `{"note": "shared"}` dict), as AOTAutograd shares forward/backward dicts;
    `p_bad_val`, the chance that one tensor op gets a `meta['val']` that is not a tensor (an int, None, `object()`, an
    empty list or a SymInt), a broken graph, named in `gm.meta["graphgen_bad_val"]`; half the time, on `aten.relu` or
    `aten.mm`, the op is then called through its packet (`aten.relu`), as a graph written by hand may call it."""
    rng = random.Random(seed)
    if n_streams is None: n_streams = rng.randint(1, 4)
    if not 1 <= n_streams <= len(USER_EVENTS): raise ValueError(f"n_streams must be 1..{len(USER_EVENTS)}")
    b = GraphBuilder(shape=shape)
    shared = torch.empty(shape, device="meta") if fast else None
    primals = [b.input(f"primals_{i + 1}", tag="is_forward") for i in range(n_primals)]
    tangents = [b.input(f"tangents_{i + 1}") for i in range(n_tangents)]
    values = primals + tangents            # candidate args, in graph order
    stream_of: dict = {}                   # node -> its stream (None = unannotated)
    recorded: list[int] = []               # user event indices recorded so far
    last_stream = 0
    shared_custom: dict = {}               # stream -> the custom dict the nodes drawn to share one share
    unread = collections.deque()           # values in creation order, some of them still without users

    def pick():
        if p_consume and rng.random() < p_consume:
            while unread and unread[0].users: unread.popleft()
            if unread: return unread.popleft()
        # biased towards recent values, O(1): an exponentially distributed distance from the end
        return values[max(0, len(values) - 1 - int(rng.expovariate(0.3)))]

    def next_stream():
        nonlocal last_stream
        if rng.random() < p_unannotated: return None
        if rng.random() >= p_stay: last_stream = rng.randrange(n_streams)
        return last_stream

    def add(target, *args, stream=None, tag="is_backward", acc=False):
        n = b.op(target, *args, stream=stream, tag=tag, acc=acc, val=shared)
        if p_shared_custom and rng.random() < p_shared_custom:
            n.meta["custom"] = shared_custom.setdefault(stream, n.meta.get("custom") or {"note": "shared"})
        values.append(n); stream_of[n] = stream
        if p_consume: unread.append(n)
        return n

    def compute(tag):
        if rng.random() < 0.4: return add(rng.choice(UNARY), pick(), stream=next_stream(), tag=tag)
        return add(rng.choice(BINARY), pick(), pick(), stream=next_stream(), tag=tag)

    for _ in range(min(n_forward, n_nodes)): compute("is_forward")
    made = min(n_forward, n_nodes)
    while made < n_nodes:
        r = rng.random()
        if r < p_acc:
            add(aten.add.Tensor, pick(), pick(), acc=True)
            made += 1
        elif r < p_acc + p_fanout and made + 2 <= n_nodes:
            # one value read on two different streams (or one of them unannotated)
            src = pick()
            for s in rng.sample(range(n_streams), min(2, n_streams)) + ([None] if n_streams == 1 else []):
                add(rng.choice(UNARY), src, stream=s)
                made += 1
                if made >= n_nodes: break
        else:
            compute("is_backward")
            made += 1
        if rng.random() < p_user_sync: _user_sync(b, rng, values, stream_of, recorded, n_streams, user_sync_tag)
    if p_copy and rng.random() < p_copy * 10 and len(values) > len(primals) + len(tangents):
        # epilogue copy_ of a mutated forward input, as AOTAutograd appends it
        for p in rng.sample(primals, rng.randint(1, len(primals))):
            src = values[rng.randrange(len(primals) + len(tangents), len(values))]
            n = b.op(aten.copy_.default, p, src, val=shared if fast else p.meta["val"])
            stream_of[n] = None
    outs = [n for n in b.graph.nodes if n.op != "placeholder" and "val" in n.meta and not n.users]
    seen = set(outs)
    for n in rng.sample(values, min(3, len(values))):
        if n not in seen and n.op != "placeholder": outs.append(n); seen.add(n)
    gm = b.output(*outs)
    ops = [n for n in values if n.op == "call_function"]
    if p_bad_val and ops and rng.random() < p_bad_val:
        bad = rng.choice(ops)
        bad.meta["val"] = rng.choice([lambda: 3, lambda: None, object, list, _symint])()
        if bad.target in TENSOR_PACKETS and rng.random() < 0.5:
            bad.target = bad.target.overloadpacket   # aten.relu, aten.mm: every overload returns a Tensor
            gm.recompile()
        gm.meta["graphgen_bad_val"] = bad.name
    return gm


def _symint():
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    return ShapeEnv().create_unbacked_symint()


def _user_sync(b, rng, values, stream_of, recorded, n_streams, tag):
    "Append a user-written record/wait/synchronize_event; waits and synchronizes only for recorded events."
    r = rng.random()
    if recorded and r < 0.4:
        b.sync(streams.wait_event.default, rng.choice(recorded), rng.randrange(n_streams), tag=tag)
    elif recorded and r < 0.55:
        b.sync(streams.synchronize_event.default, rng.choice(recorded), tag=tag)
    else:
        last = values[-1]
        s = stream_of.get(last)
        e = USER_EVENTS[len(recorded) % len(USER_EVENTS)]   # reuse indices once all are taken
        b.sync(streams.record_event.default, e, 0 if s is None else s, tag=tag)
        recorded.append(e)


def graphs(**fixed):
    """A hypothesis strategy of `random_backward_graph` graphs: seed and shape options drawn, `fixed` kwargs kept.

    Example: `@given(graphs(n_streams=2))`."""
    from hypothesis import strategies as st
    opts = dict(n_nodes=st.integers(1, 40), n_streams=st.integers(1, 4), n_forward=st.integers(0, 3),
                p_unannotated=st.sampled_from([0.0, 0.15, 0.5]), p_acc=st.sampled_from([0.0, 0.1, 0.3]),
                p_user_sync=st.sampled_from([0.0, 0.08, 0.3]), p_copy=st.sampled_from([0.0, 0.1]))
    opts.update({k: st.just(v) for k, v in fixed.items()})
    return st.builds(random_backward_graph, st.integers(0, 2**32 - 1), **opts)


def random_dag_graph(seed: int, *, n_ops: int = 16000, p_side: float = 0.4, n_side: int = 2,
                     p_unannotated: float = 0.25, p_acc: float = 0.02, reach: float = 8.0, n_primals: int = 16,
                     n_tangents: int = 16, p_unary: float = 0.1, shape: tuple = (4, 4)) -> GraphModule:
    """A random DAG of `n_ops` backward ops, the same for the same arguments (the benchmarks' `dag` shape).

    Unlike `random_backward_graph` there are no runs on one stream: each op independently goes to a side stream
    (`1..n_side`) with probability `p_side`, is left unannotated (the current stream) with `p_unannotated`, else
    runs on stream 0, so many edges cross streams. Ops are unary (`p_unary`) or binary, reading values at an
    exponentially distributed distance (mean `reach`) back in graph order; `p_acc` of them are gradient
    accumulations (no stream). No user-written syncs. Every compute node shares one meta `val` (fast to build).
    The output returns every node without users. With the defaults PyTorch 2.13's pipeline leaves about 6 nodes per
    op (16.7k ops, seed 0: 100,242 nodes; streamnb's default mode about twice as many)."""
    rng = random.Random(seed)
    b = GraphBuilder(shape=shape)
    shared = torch.empty(shape, device="meta")
    values = [b.input(f"primals_{i + 1}", tag="is_forward") for i in range(n_primals)]
    values += [b.input(f"tangents_{i + 1}") for i in range(n_tangents)]
    rate = 1.0 / reach

    def pick():
        return values[max(0, len(values) - 1 - int(rng.expovariate(rate)))]

    for _ in range(n_ops):
        r = rng.random()
        if r < p_acc:
            values.append(b.op(aten.add.Tensor, pick(), pick(), acc=True, val=shared))
            continue
        r = rng.random()
        stream = rng.randint(1, n_side) if r < p_side else None if r < p_side + p_unannotated else 0
        if rng.random() < p_unary: n = b.op(rng.choice(UNARY), pick(), stream=stream, val=shared)
        else: n = b.op(rng.choice(BINARY), pick(), pick(), stream=stream, val=shared)
        values.append(n)
    outs = [n for n in b.graph.nodes if n.op != "placeholder" and not n.users]
    return b.output(*outs)


# ---------------------------------------------------------------------------------------------------------------
# Aliasing-heavy graphs on many streams (issue 22)
# ---------------------------------------------------------------------------------------------------------------

ALIAS_EVENTS = tuple(range(40, 44))   # few user events, so they are reused, across streams too
VIEW_OPS = ("t", "transpose", "view", "slice_expand")
INPLACE_OPS = (aten.add_.Tensor, aten.mul_.Tensor, aten.copy_.default)
MULTI_OPS = ("native_layer_norm", "native_layer_norm_backward", "var_mean", "topk")
SPLIT_OPS = ("split", "split_with_sizes", "chunk", "unbind")


def _writable(v) -> bool:
    "No two elements of `v` share memory (an in-place op may write it)."
    return all(st != 0 or sz == 1 for st, sz in zip(v.stride(), v.shape))


def random_alias_graph(seed: int, *, n_nodes: int = 24, n_streams: int | None = None, n_primals: int = 2,
                       n_tangents: int = 2, p_view: float = 0.2, p_inplace: float = 0.12, p_multi: float = 0.1,
                       p_split: float = 0.1, p_user_sync: float = 0.15, p_keyword: float = 0.5,
                       p_unannotated: float = 0.05, p_acc: float = 0.05, p_stay: float = 0.4, p_copy: float = 0.0,
                       size: int = 4, p_join: float = 0.0) -> GraphModule:
    """A random backward-like graph with aliasing on many streams, the same for the same arguments.

    Besides `random_backward_graph`'s elementwise ops and `mm`: views (`t`, `transpose`, `view`, `slice` then
    `expand`) annotated on another stream than their base; in-place `add_`/`mul_`/`copy_` into intermediates, also
    through a view; multi-output ops (`native_layer_norm` and its backward, `var_mean`, `topk`) whose getitems are
    annotated on other streams; `split`/`split_with_sizes`/`chunk`/`unbind` with getitems on other streams, their
    pieces read and put back with `cat`/`stack`; user `record_event`/`wait_event`/`synchronize_event` in positional or
    keyword form (`p_keyword`), with few event indices (`ALIAS_EVENTS`) so they are recorded again on other streams.
    `n_streams=None` draws 8..12 (indices 0..n-1; 0 is the current stream). Every value in the pool is `size x size`
    float32 on the meta device. In-place writes never target a graph input (the epilogue `copy_`s of `p_copy` do).
    `p_join` (off by default: the same graphs as before): the chance, after each node, of a user `wait_stream` that
    makes a random stream wait for the last node's stream (fork/join code: the allocating stream of a value read
    elsewhere often waits before its next kernel, which orders the reuse of a block freed to it; issue 46, item 5)."""
    rng = random.Random(seed)
    if n_streams is None: n_streams = rng.randint(8, 12)
    N = size
    b = GraphBuilder(shape=(N, N))
    primals = [b.input(f"primals_{i + 1}", tag="is_forward") for i in range(n_primals)]
    tangents = [b.input(f"tangents_{i + 1}") for i in range(n_tangents)]
    pool = primals + tangents        # N x N float values
    base = {n: n for n in pool}      # value -> the node that owns its memory (the generator's own alias map)
    stream_of: dict = {}
    recorded: list[int] = []
    last_stream = 0

    def pick(exclude_base=None):
        for _ in range(8):
            v = pool[max(0, len(pool) - 1 - int(rng.expovariate(0.25)))]
            if exclude_base is None or base[v] != exclude_base: return v
        return None

    def stream():
        nonlocal last_stream
        if rng.random() < p_unannotated: return None
        if rng.random() >= p_stay: last_stream = rng.randrange(n_streams)
        return last_stream

    def other_stream(s):
        "A stream other than `s` (the point of these nodes)."
        return rng.choice([i for i in range(n_streams) if i != s]) if n_streams > 1 else s

    def op(target, *args, s="draw", owner=None, keep=True, **kw):
        s = stream() if s == "draw" else s
        n = b.op(target, *args, stream=s, **kw)
        stream_of[n] = s
        base[n] = n if owner is None else owner
        if keep: pool.append(n)
        return n

    def view():
        src = pick(); s = other_stream(stream_of.get(src, 0) or 0)
        kind = rng.choice(VIEW_OPS)
        if kind == "t": return op(aten.t.default, src, s=s, owner=base[src])
        if kind == "transpose": return op(aten.transpose.int, src, 0, 1, s=s, owner=base[src])
        if kind == "view" and src.meta["val"].is_contiguous(): return op(aten.view.default, src, [N, N], s=s, owner=base[src])
        row = op(aten.slice.Tensor, src, 0, 0, 1, s=s, owner=base[src], keep=False)
        return op(aten.expand.default, row, [N, N], s=other_stream(s), owner=base[src])

    def inplace():
        cands = [v for v in pool[-12:] if base[v] not in primals + tangents and _writable(v.meta["val"])]
        if not cands: return compute()
        dst = rng.choice(cands)
        src = pick(exclude_base=base[dst])
        if src is None: return compute()
        s = other_stream(stream_of.get(dst, 0) or 0) if rng.random() < 0.5 else stream()
        return op(rng.choice(INPLACE_OPS), dst, src, s=s, owner=base[dst])

    def getitems(node, s, count):
        return [op(operator.getitem, node, i, s=other_stream(s) if rng.random() < 0.7 else s, owner=(node, i), keep=False)
                for i in range(count)]

    def widen(col):
        "An N x 1 value, viewed as N x N on another stream."
        return op(aten.expand.default, col, [N, N], s=other_stream(stream_of.get(col, 0) or 0), owner=base[col])

    def multi():
        kind = rng.choice(MULTI_OPS); src = pick(); s = stream()
        if kind in ("native_layer_norm", "native_layer_norm_backward"):
            ln = op(aten.native_layer_norm.default, src, [N], None, None, 1e-5, s=s, keep=False)
            out, mean, rstd = getitems(ln, s, 3)
            pool.append(out)
            if kind == "native_layer_norm": return widen(rng.choice([mean, rstd]))
            bw = op(aten.native_layer_norm_backward.default, pick(), src, [N], mean, rstd, None, None,
                    [True, False, False], s=stream(), keep=False)
            (gi,) = getitems(bw, stream_of[bw], 1)   # outputs 1 and 2 are None
            pool.append(gi)
            return gi
        if kind == "var_mean":
            vm = op(aten.var_mean.correction, src, [1], correction=1, keepdim=True, s=s, keep=False)
            var, mean = getitems(vm, s, 2)
            return widen(rng.choice([var, mean]))
        tk = op(aten.topk.default, src, N, -1, s=s, keep=False)
        values, indices = getitems(tk, s, 2)
        pool.append(values)
        return values

    def split():
        kind = rng.choice(SPLIT_OPS); src = pick(); s = stream()
        if kind == "split": node, k = op(aten.split.Tensor, src, N // 2, s=s, owner=base[src], keep=False), 2
        elif kind == "split_with_sizes": node, k = op(aten.split_with_sizes.default, src, [1, N - 1], s=s, owner=base[src], keep=False), 2
        elif kind == "chunk": node, k = op(aten.chunk.default, src, 2, s=s, owner=base[src], keep=False), 2
        else: node, k = op(aten.unbind.int, src, s=s, owner=base[src], keep=False), N
        pieces = [op(operator.getitem, node, i, s=other_stream(s), owner=base[src], keep=False) for i in range(k)]
        read = [op(rng.choice(UNARY), p, s=stream(), keep=False) if rng.random() < 0.5 else p for p in pieces]
        return op(aten.stack.default if kind == "unbind" else aten.cat.default, read, s=stream())

    def compute():
        if rng.random() < 0.4: return op(rng.choice(UNARY), pick())
        return op(rng.choice(BINARY), pick(), pick())

    def user_sync():
        r = rng.random()
        kw = rng.random() < p_keyword
        def sync(target, names, args):
            if not kw: return b.sync(target, *args)
            n = b.graph.call_function(target, (), dict(zip(names, args)))
            return n
        if recorded and r < 0.45:
            sync(streams.wait_event.default, ("event_index", "stream_index"), (rng.choice(recorded), rng.randrange(n_streams)))
        elif recorded and r < 0.55:
            sync(streams.synchronize_event.default, ("event_index",), (rng.choice(recorded),))
        else:
            s = stream_of.get(pool[-1]); s = 0 if s is None else s
            e = rng.choice(ALIAS_EVENTS)
            sync(streams.record_event.default, ("event_index", "stream_index"), (e, s))
            recorded.append(e)

    made = 0
    while made < n_nodes:
        r = rng.random()
        if r < p_view: view()
        elif r < p_view + p_inplace: inplace()
        elif r < p_view + p_inplace + p_multi: multi()
        elif r < p_view + p_inplace + p_multi + p_split: split()
        elif r < p_view + p_inplace + p_multi + p_split + p_acc: op(aten.add.Tensor, pick(), pick(), s=None, acc=True)
        else: compute()
        made += 1
        if rng.random() < p_user_sync: user_sync()
        if p_join and rng.random() < p_join:
            s = stream_of.get(pool[-1]); s = 0 if s is None else s
            b.sync(streams.wait_stream.default, rng.randrange(n_streams), s)
    if p_copy and rng.random() < p_copy * 10:
        for p in rng.sample(primals, rng.randint(1, len(primals))):
            src = pick(exclude_base=p)
            if src is not None: b.op(aten.copy_.default, p, src, val=p.meta["val"])
    outs = [n for n in b.graph.nodes if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
            and not n.users]
    seen = set(outs)
    for n in rng.sample(pool, min(3, len(pool))):
        if n not in seen and n.op != "placeholder": outs.append(n); seen.add(n)
    return b.output(*outs)


def alias_graphs(**fixed):
    """A hypothesis strategy of `random_alias_graph` graphs (seed and mix drawn, `fixed` kwargs kept)."""
    from hypothesis import strategies as st
    opts = dict(n_nodes=st.integers(4, 28), n_streams=st.integers(8, 12), p_view=st.sampled_from([0.1, 0.25]),
                p_inplace=st.sampled_from([0.0, 0.1, 0.2]), p_multi=st.sampled_from([0.05, 0.15]),
                p_split=st.sampled_from([0.05, 0.15]), p_user_sync=st.sampled_from([0.0, 0.15, 0.3]),
                p_keyword=st.sampled_from([0.0, 0.5, 1.0]), p_copy=st.sampled_from([0.0, 0.1]))
    opts.update({k: st.just(v) for k, v in fixed.items()})
    return st.builds(random_alias_graph, st.integers(0, 2**32 - 1), **opts)
