"""Simulator throughput on 10k-100k-node backward-like graphs on three streams.

    python benchmarks/bench_simulate.py [--sizes 10000 20000 50000 100000] [--roofline] [--contention] [--calibrated]

Prints nodes per second per size and the per-node time relative to the smallest graph: a simulator that is O(n)
keeps that ratio near 1 (with --contention, O(n·k) for k streams: also flat, k is fixed here). Numbers go to stdout;
nothing is asserted (speed is measured, never tested). --contention simulates with `contention=True` (kernels share
the device, demands from the roofline; issue 13 item 5 needs 20k nodes well under a minute). --calibrated simulates on
`calibrated("H100")` (chapter 03: fixed kernel time, work occupancy, host issue and wake-up, dispatch rate; issue 24)."""
import argparse
import gc
import time

from streamnb.examples import backward_like
from streamnb.cost import calibrated
from streamnb.simulator import simulate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 50_000, 100_000])
    ap.add_argument("--roofline", action="store_true", help="use the default roofline cost instead of 1 ms per kernel")
    ap.add_argument("--contention", action="store_true", help="simulate with contention=True (kernels share the device)")
    ap.add_argument("--calibrated", action="store_true", help="on calibrated('H100') instead of the ideal H100 row")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cost = None if args.roofline else (lambda n: 1.0)
    base, ratio = None, 1.0
    device = calibrated("H100") if args.calibrated else "H100"
    print(f"{'contention' if args.contention else 'free overlap'}, {'roofline' if args.roofline else '1 ms per kernel'}, "
          f"{'calibrated' if args.calibrated else 'ideal'} H100")
    print(f"{'nodes':>8} {'best s':>8} {'nodes/s':>10} {'us/node':>8} {'vs smallest':>11}  makespan_us  peak_bytes")
    for size in args.sizes:
        gm = backward_like(size)
        n = len(gm.graph.nodes)
        gc.collect()   # simulate pauses the collector inside its own call, as a user's call gets it
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            tl = simulate(gm, cost=cost, contention=args.contention, device=device)
            best = min(best, time.perf_counter() - t0)
        per = best / n
        base = base or per
        ratio = per / base
        print(f"{n:>8} {best:>8.3f} {n / best:>10.0f} {per * 1e6:>8.2f} {ratio:>11.2f}  {tl.makespan_us:>11.1f}  {tl.peak_memory}")
    print(f"per-node time at the largest size is {ratio:.2f}x the smallest's "
          f"({'flat within 1.3x' if ratio <= 1.3 else 'NOT flat: above 1.3x'}; a noisy machine moves it by tens of percent)")


if __name__ == "__main__":
    main()
