"""streamnb: GPU stream semantics for compiled PyTorch graphs, as literate notebooks.

The seed's passes under the seed's names (`upstream=True` for the seed's, node for node: torch 2.13's streams.py without its `wait_stream` handling,
PR #185627), the stream-op model
they and everything after them share (`streamnb.streamops`), the simulator, plots, trace export, sanitizer, capture
of real models, the CUDA executor, explain, and automatic stream assignment (`assign_streams`).

`__all__` is the user-facing surface (about 20 names). The seed's functions under the seed's names
(`insert_sync`, `assign_backward_streams`, `sync_deallocations`, `IndexedDict`, ...) and every other tool are imported
from their modules (`from streamnb.syncs import insert_sync`), whose `__all__`s list them.

The functions `streamnb.simulate`, `streamnb.capture` and `streamnb.explain` live in the modules
`streamnb.simulator`, `streamnb.capturing` and `streamnb.explainer` (`import streamnb.simulator as m` gives the
module); the example models and graphs (and the course's running example) are in `streamnb.examples`, the graders of
the course's exercises in `streamnb.exercises`.
"""
__version__ = "0.1.0"

TESTED_TORCH = ("2.13",)   # torch releases (major.minor) on which the passes are checked equal to torch's own


def _check_torch():
    """ImportError if torch lacks the internals streamnb imports (torch < 2.13); a `UserWarning` on a torch release
    outside `TESTED_TORCH`: streamnb then runs on FX's public path, but its passes are not checked against that torch's."""
    import importlib.util, warnings
    import torch
    def missing(name):
        try: return importlib.util.find_spec(name) is None
        except ImportError: return True   # a parent package is missing too
    needed = ("torch._dynamo.variables.streams",                 # registers the torch.ops.streams.* operators
              "torch._inductor.fx_passes.control_dependencies")  # the control_deps higher-order op
    absent = [m for m in needed if missing(m)]
    if absent: raise ImportError(f"streamnb needs torch>=2.13: torch {torch.__version__} has no {', '.join(absent)}")
    if ".".join(torch.__version__.split("+")[0].split(".")[:2]) not in TESTED_TORCH:
        warnings.warn(f"streamnb: torch {torch.__version__} is not a release streamnb was checked on "
                      f"({', '.join(TESTED_TORCH)}): FX's public path is used (no fast path), and the passes' "
                      f"equality with torch's own is checked on those releases only", UserWarning, stacklevel=2)


_check_torch()

from .graph import GraphBuilder, StreamRegistry, StreamnbError, use_registry
from .pipeline import run_stream_passes, sync_forward
from .simulator import Timeline, simulate
from .plot import plot_memory, plot_timeline
from .trace import write_chrome_trace
from .sanitizer import Report, sanitize
from .cpustreams import cpu_streams
from .capturing import Capture, capture
from .explainer import Explanation, explain
from .cuda import Backend
from .compiling import executor_backend, explain_compiled, use_streamnb_passes
from .choosing import assign_streams

__all__ = [
    # build and hold a graph
    "GraphBuilder", "StreamRegistry", "use_registry", "StreamnbError",
    # the pipeline: the passes in AOTAutograd's order
    "run_stream_passes", "sync_forward",
    # judge and draw
    "sanitize", "Report", "simulate", "Timeline", "plot_timeline", "plot_memory", "write_chrome_trace",
    # real programs: capture, explain, the torch.compile switch
    "cpu_streams", "capture", "Capture", "explain", "Explanation", "use_streamnb_passes", "executor_backend",
    "explain_compiled", "Backend",
    # assignment
    "assign_streams",
]
