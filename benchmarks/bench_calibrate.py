"""The simulator against published measurements (issue 24): IOS's V100 batch-1 latencies, one stream against
several streams (IOS-Parallel), next to what streamnb predicts for the same models (chapter 22).

    python benchmarks/bench_calibrate.py [--device V100] [--side-streams 3] [--strategies nimble critical_path]
                                         [--models inception_v3 randwire nasnet squeezenet] [--ideal] [--each [S ...]]

For each model: captured at random init (Inception-v3 needs torchvision; it is skipped, saying so, without it), the
engine's inference graph (`engine_view`), streams assigned by each strategy with `assign_streams`, the passes' syncs,
simulated with contention on `calibrated(device)`. Prints measured and predicted speedups, measured and simulated
one-stream latencies, Kendall's tau and the mean relative error, and the seconds each step took on this CPU.
`--ideal` adds the ideal model of the device table (no fixed kernel time, every kernel fills the device).
The measured numbers are IOS's (`streamnb.calibration.IOS_SOURCE`); every predicted number is an estimate.
"""
from __future__ import annotations

import argparse
import time
import warnings

from streamnb.calibration import (IOS_MODELS, IOS_SOURCE, IOS_V100, capture_ios_model, compare, kendall_tau,
                                  mean_relative_error, predict)
from streamnb.cost import calibrated, get_device_spec


def table(rows, label: str) -> None:
    print(f"\n{label}")
    print(f"{'model':13} {'speedup measured':>16} {'predicted':>9}   {'1 stream measured':>17} {'simulated':>9}  "
          f"{'kernels':>7}  strategy")
    for name, meas, pred, seq, sim, strategy, k in rows:
        print(f"{name:13} {meas:16.2f} {pred:9.2f}   {seq:14.2f} ms {sim:6.2f} ms  {k:7}  {strategy}")
    if len(rows) >= 2:
        pred, meas = [r[2] for r in rows], [r[1] for r in rows]
        ratio = [r[3] / r[4] for r in rows]
        print(f"Kendall tau {kendall_tau(pred, meas):+.2f}, mean relative error {mean_relative_error(pred, meas):.1%}, "
              f"one-stream measured / simulated {min(ratio):.2f} to {max(ratio):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="V100")
    ap.add_argument("--side-streams", type=int, default=3)
    ap.add_argument("--strategies", nargs="+", default=["nimble", "critical_path"])
    ap.add_argument("--models", nargs="+", default=list(IOS_MODELS), choices=list(IOS_MODELS))
    ap.add_argument("--ideal", action="store_true", help="also the ideal model of the device table")
    ap.add_argument("--each", nargs="*", metavar="STRATEGY", default=None,
                    help="also each strategy's own predicted speedup per model (default with the flag alone: "
                         "nimble critical_path streamnb), and whether streamnb's is at least the best baseline's")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
    print(f"measured: {IOS_SOURCE}")
    graphs = {}
    for name in args.models:
        t0 = time.perf_counter()
        gm = capture_ios_model(name)
        if gm is None:
            print(f"{name}: skipped, torchvision is not installed (pip install --no-deps torchvision==0.28.0)")
            continue
        graphs[name] = gm
        print(f"{name}: captured in {time.perf_counter() - t0:.1f} s")
    kw = dict(strategies=tuple(args.strategies), side_streams=args.side_streams)
    t0 = time.perf_counter()
    table(compare(graphs, calibrated(args.device), **kw),
          f"calibrated {args.device} ({args.side_streams} side streams, best of {', '.join(args.strategies)}), "
          f"{time.perf_counter() - t0:.1f} s:")
    if args.ideal:
        table(compare(graphs, get_device_spec(args.device), **kw), f"ideal {args.device}:")
    if args.each is not None:
        each(graphs, calibrated(args.device), args.each or ["nimble", "critical_path", "streamnb"], args.side_streams)


def each(graphs, spec, strategies, side_streams: int) -> None:
    "Each strategy's predicted speedup on each model (issue 24 item 3: streamnb's at least the best baseline's)."
    print(f"\neach strategy's predicted speedup over one stream, calibrated {spec.name}, {side_streams} side streams:")
    print(f"{'model':13} {'measured':>8} " + " ".join(f"{s:>13}" for s in strategies) + "  streamnb >= best baseline")
    for name, gm in graphs.items():
        got = {s: predict(gm, spec, strategies=(s,), side_streams=side_streams).speedup for s in strategies}
        base = [v for s, v in got.items() if s != "streamnb"]
        verdict = "-" if "streamnb" not in got or not base else str(got["streamnb"] >= max(base) * (1 - 1e-9))
        seq, par = IOS_V100[name]
        print(f"{name:13} {seq / par:8.2f} " + " ".join(f"{got[s]:13.2f}" for s in strategies) + f"  {verdict}")


if __name__ == "__main__":
    main()
