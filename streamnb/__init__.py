"""streamnb: GPU stream semantics for compiled PyTorch graphs, as literate notebooks.

The seed's passes under the seed's names (`upstream=True` for PyTorch's behaviour node for node), the stream-op model
they and everything after them share (`streamnb.streamops`), the simulator, plots, trace export, sanitizer, capture
of real models, the CUDA executor, explain, and automatic stream assignment (`assign_streams`).

The functions `streamnb.simulate`, `streamnb.capture` and `streamnb.explain` live in the modules
`streamnb.simulator`, `streamnb.capturing` and `streamnb.explainer` (`import streamnb.simulator as m` gives the
module); the example models and graphs (and the course's running example) are in `streamnb.examples`, the graders of
the course's exercises in `streamnb.exercises`.
"""
__version__ = "0.1.0"

from .graph import (IndexedDict, GraphBuilder, StreamRegistry, StreamnbError, StreamAnnotationError, MissingValError,
                    UnknownEventError, AlreadyProcessedWarning, get_stream, set_stream, is_bwd_node, is_gradient_acc,
                    get_registry, use_registry, canonical, describe)
from .cost import DEVICE_SPECS, DeviceSpec, get_roofline_estimate
from .assign import assign_backward_streams, assign_epilogue_copy_streams
from .syncs import insert_backward_syncs, insert_sync, insert_record_event_after_node, insert_wait_event_before_node
from .dealloc import populate_stream_timeline, handle_synced_deallocation, sync_deallocations
from .control_deps import wrap_all_sync_nodes_with_control_deps
from .metadata import populate_fw_metadata_with_stream_indices
from .pipeline import run_stream_passes
from .simulator import Timeline, simulate
from .plot import plot_memory, plot_timeline
from .trace import to_chrome_trace, write_chrome_trace
from .sanitizer import Report, SanitizerError, sanitize
from .capturing import Capture, capture
from .explainer import Explanation, explain
from .compiling import DynamoRegistry, UnsupportedTorchError, executor_backend, use_streamnb_passes
from .choosing import assign_streams
