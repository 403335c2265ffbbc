"""Measurements on a CUDA GPU that the simulator's cost model is checked and calibrated against (issue 24), and user
programs with stream objects under torch.compile on CUDA (issue 27). Run by tools/gpu_check.sh; needs a CUDA device.

    python benchmarks/gpu_measurements.py [--out results.json] [--quick]

Every figure is a median of repeated runs on this one device, printed with what it measures:
1. launch costs: the host's time to issue one tiny kernel; the GPU's time per tiny kernel with the host taken out
   (a CUDA graph of many launches), on one stream and spread over two (does a second stream overlap the fixed cost?);
   the host's wake-up after a host sync (event.synchronize on a kernel of known length);
2. achieved fraction of the roofline (streamnb.cost's device table) against kernel size: matmul in FP32 (TF32 off), TF32
   and BF16, and an elementwise add, each timed in a CUDA graph;
3. published models at batch 1 (IOS, MLSys 2021): eager forward with the host (as users run it) and replayed in a
   CUDA graph (the GPU alone), next to streamnb's simulated one-stream makespan of the captured forward;
4. user programs written with stream objects (torch.cuda.Stream, wait_stream, record_stream, events, an
   autograd.Function whose backward uses a side stream): eager, torch.compile with PyTorch's own passes and with
   streamnb's (use_streamnb_passes); outputs and gradients against eager.
Each section runs on its own: a failure is printed and recorded, and the next section runs.
"""
from __future__ import annotations

import argparse, json, statistics, time, traceback

import torch

from streamnb.cuda_demos import graph_replay_ms   # median time of one CUDA-graph replay of fn(), ms

RESULTS: dict = {}


def median(xs): return statistics.median(xs)


def section(name):
    def wrap(f):
        def run(*a, **k):
            print(f"\n=== {name}", flush=True); t0 = time.perf_counter()
            try: RESULTS[name] = f(*a, **k)
            except Exception as e:
                RESULTS[name] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc(limit=4)
            print(f"=== {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        return run
    return wrap


@section("launch costs")
def launch_costs(n: int = 2000):
    x = torch.zeros(1, device="cuda")
    for _ in range(100): x.add_(1)
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n): x.add_(1)
        host.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    one = graph_replay_ms(lambda: [x.add_(1) for _ in range(n)]) / n * 1e3
    y, s1, s2 = torch.zeros(1, device="cuda"), torch.cuda.Stream(), torch.cuda.Stream()
    def two():
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur); s2.wait_stream(cur)
        with torch.cuda.stream(s1):
            for _ in range(n // 2): x.add_(1)
        with torch.cuda.stream(s2):
            for _ in range(n // 2): y.add_(1)
        cur.wait_stream(s1); cur.wait_stream(s2)
    two_us = graph_replay_ms(two) / n * 1e3
    # host wake-up: a kernel of known GPU length, then event.synchronize(); host time past the kernel's end
    wake, sync_rt = [], []
    for _ in range(30):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record(); torch.cuda._sleep(100_000); b.record()
        t0 = time.perf_counter(); b.synchronize(); host_ms = (time.perf_counter() - t0) * 1e3
        wake.append((host_ms - a.elapsed_time(b)) * 1e3)   # µs the host waited beyond the GPU time (an upper bound)
        t0 = time.perf_counter(); torch.cuda.synchronize(); sync_rt.append((time.perf_counter() - t0) * 1e6)
    r = dict(host_issue_us_per_kernel=median(host), gpu_us_per_tiny_kernel_one_stream=one,
             gpu_us_per_tiny_kernel_two_streams=two_us, host_wakeup_after_event_sync_us=median(wake),
             empty_device_synchronize_us=median(sync_rt))
    for k, v in r.items(): print(f"{k:40} {v:8.2f}")
    return r


@section("achieved fraction of the roofline")
def roofline(quick: bool):
    from streamnb.cost import DEVICE_SPECS
    name = torch.cuda.get_device_name()
    spec = next((v for k, v in DEVICE_SPECS.items() if k in name), DEVICE_SPECS["H100"])
    rows = []
    sizes = (256, 1024, 4096) if quick else (128, 256, 512, 1024, 2048, 4096, 8192)
    for mode, dtype, tflops in (("fp32", torch.float32, spec.fp32_tflops), ("tf32", torch.float32, spec.tf32_tflops),
                                ("bf16", torch.bfloat16, spec.bf16_tflops)):
        torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
        for n in sizes:
            a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
            reps = max(1, min(50, int(2e11 // (2 * n ** 3))))
            ms = graph_replay_ms(lambda: [a @ b for _ in range(reps)]) / reps
            flops, nbytes = 2 * n ** 3, 3 * n * n * a.element_size()
            roof = max(flops / (tflops * 1e12), nbytes / (spec.hbm_gbps * 1e9)) * 1e3
            rows.append(dict(op=f"matmul {mode}", size=n, measured_us=ms * 1e3, roofline_us=roof * 1e3,
                             fraction=roof / ms))
    torch.backends.cuda.matmul.allow_tf32 = False
    for p in ((12, 16, 20, 24) if quick else (10, 12, 14, 16, 18, 20, 22, 24, 26, 28)):
        a, b = torch.randn(2 ** p, device="cuda"), torch.randn(2 ** p, device="cuda")
        reps = max(1, min(100, 2 ** (28 - p)))
        ms = graph_replay_ms(lambda: [a + b for _ in range(reps)]) / reps
        roof = 3 * 4 * 2 ** p / (spec.hbm_gbps * 1e9) * 1e3
        rows.append(dict(op="add fp32", size=2 ** p, measured_us=ms * 1e3, roofline_us=roof * 1e3, fraction=roof / ms))
    print(f"device spec {spec.name}: fp32 {spec.fp32_tflops} TF/s, tf32 {spec.tf32_tflops}, bf16 {spec.bf16_tflops}, "
          f"HBM {spec.hbm_gbps} GB/s")
    print(f"{'op':12} {'size':>10} {'measured':>11} {'roofline':>11} {'fraction':>8}")
    for r in rows: print(f"{r['op']:12} {r['size']:10d} {r['measured_us']:8.2f} µs {r['roofline_us']:8.2f} µs {r['fraction']:8.3f}")
    return dict(spec=spec.name, rows=rows)


@section("published models at batch 1")
def published(quick: bool):
    import torchvision.models as tvm
    from streamnb.capturing import capture
    from streamnb.simulator import simulate
    from streamnb.graph import StreamRegistry
    torch.backends.cudnn.benchmark = False
    out = {}
    models = {"inception_v3": (lambda: tvm.inception_v3(weights=None, aux_logits=False, init_weights=True), 299),
              "squeezenet1_0": (lambda: tvm.squeezenet1_0(weights=None), 224),
              "googlenet": (lambda: tvm.googlenet(weights=None, aux_logits=False, init_weights=True), 224),
              "resnet50": (lambda: tvm.resnet50(weights=None), 224)}
    if quick: models = {k: models[k] for k in ("squeezenet1_0",)}
    name = torch.cuda.get_device_name()
    for mname, (make, px) in models.items():
        torch.manual_seed(0)
        m = make().eval()
        x = torch.randn(1, 3, px, px)
        mc, xc = m.cuda(), x.cuda()
        with torch.no_grad():
            for _ in range(5): mc(xc)
            torch.cuda.synchronize()
            eager = []
            for _ in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(); mc(xc); b.record(); b.synchronize(); eager.append(a.elapsed_time(b))
            replay = graph_replay_ms(lambda: mc(xc), iters=20)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof: mc(xc); torch.cuda.synchronize()
            kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        m = m.cpu()
        cap = capture(m, x.requires_grad_(True))
        spec = "H200" if "H200" in name else "H100"
        est = simulate(cap.forward, device=spec, registry=StreamRegistry(start=100, current_stream=cap.current_stream))
        r = out[mname] = dict(eager_ms=median(eager), cuda_graph_ms=replay, kernels=kernels,
                              forward_nodes=sum(1 for n in cap.forward.graph.nodes if n.op == "call_function"),
                              simulated_one_stream_ms=est.makespan, spec=spec)
        print(f"{mname:14} eager (host in it) {r['eager_ms']:.3f} ms, CUDA graph {replay:.3f} ms, {kernels} kernels; "
              f"simulated one stream on {spec}: {est.makespan:.3f} ms over {r['forward_nodes']} nodes "
              f"(simulated/graph {est.makespan / replay:.2f})")
    return out


def user_programs():
    "Programs as users write them: stream objects, wait_stream, record_stream, events, a custom backward on a side stream."
    side = torch.cuda.Stream()

    def wait_stream_fn(x, w):
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            a = torch.relu(x @ w)
        cur.wait_stream(side)
        a.record_stream(cur)
        return (a * x).sum()

    def event_fn(x, w):
        e = torch.cuda.Event()
        with torch.cuda.stream(side):
            a = torch.tanh(x @ w); e.record(side)
        torch.cuda.current_stream().wait_event(e)
        return (a + x).sum()

    class SideBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            cur = torch.cuda.current_stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                gw = x.t() @ g
            gx = g @ w.t()
            cur.wait_stream(side)
            return gx, gw

    def custom_fn(x, w): return torch.relu(SideBackward.apply(x, w)).sum()
    return {"wait_stream + record_stream": wait_stream_fn, "events": event_fn, "autograd.Function side-stream backward": custom_fn}


@section("user programs under torch.compile on CUDA")
def compiled_user_programs():
    from streamnb.compiling import use_streamnb_passes
    out = {}
    for name, fn in user_programs().items():
        torch.manual_seed(0)
        x0, w0 = torch.randn(512, 512, device="cuda"), torch.randn(512, 512, device="cuda") / 20
        def run(f):
            x, w = x0.clone().requires_grad_(True), w0.clone().requires_grad_(True)
            y = f(x, w); y.backward(); torch.cuda.synchronize()
            return y.detach(), x.grad, w.grad
        want = run(fn)
        row = {}
        for mode in ("torch's passes", "streamnb's passes"):
            torch._dynamo.reset()
            try:
                if mode == "torch's passes": got = run(torch.compile(fn, backend="aot_eager"))
                else:
                    with use_streamnb_passes(): got = run(torch.compile(fn, backend="aot_eager"))
                same = all(torch.allclose(a, b, rtol=1e-3, atol=1e-3) for a, b in zip(got, want))
                row[mode] = "equal to eager" if same else "DIFFERENT from eager"
            except Exception as e:
                row[mode] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        out[name] = row
        print(f"{name}:"); [print(f"    {k:18} {v}") for k, v in row.items()]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None); ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available(): raise SystemExit("gpu_measurements.py needs a CUDA device")
    RESULTS["device"] = dict(name=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                             sms=torch.cuda.get_device_properties(0).multi_processor_count,
                             date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(RESULTS["device"])
    launch_costs(); roofline(args.quick); compiled_user_programs(); published(args.quick)
    if args.out:
        with open(args.out, "w") as f: json.dump(RESULTS, f, indent=1, default=str)


if __name__ == "__main__": main()
