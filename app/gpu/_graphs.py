"""CUDA graphs: a repeated sequence of launches recorded once from a stream and replayed.

A product that is a few small kernels pays a few microseconds of host launch overhead per
kernel in PyCUDA; replaying a recorded graph costs one launch, and the GPU runs its nodes back to
back. The project's PyCUDA build has no graph API, so this module calls the driver's stream
capture directly (``libcuda`` through ctypes; the context is PyCUDA's, current on the calling
thread).

What may be captured: launches and async copies on the capturing stream, and on other streams
that join it through an event the capturing stream recorded (fork/join; every joined stream must
be joined back before the capture ends), cuBLAS calls on those streams, and NCCL calls (NCCL
supports capture). What may not: anything that waits on the host (``synchronize``, event
queries, blocking copies, host staging of an MPI collective), allocations, and timing events.
The capture runs in relaxed mode, so other threads' driver calls are not disturbed.

Every pointer and scalar argument is frozen at capture: buffers must stay where they are (the
engines' arena arrays do) and values that change between replays must live in device memory.

Priorities: a replay runs with node priorities. Launches issued inside :func:`background_work` (a
product that fills every SM for a long time) keep the lowest priority; every other kernel (an
NCCL exchange, the small kernels on the critical path after it) gets the highest. Without that
the hardware dispatches the long kernel's waves first and an exchange recorded beside it, on
another stream, only starts when that kernel drains: the overlap the two streams were for does
not happen.
"""
import contextlib
import ctypes
import ctypes.util

from ..errors import HisparseError

#: CUstreamCaptureMode: RELAXED lets other threads keep making unsafe calls during a capture.
_CAPTURE_MODE_RELAXED = 2
#: CUgraphInstantiate_flags: run the graph with its nodes' priorities, not its stream's.
_INSTANTIATE_USE_NODE_PRIORITY = 8
#: CUgraphNodeType of a kernel node.
_NODE_KERNEL = 0
#: CUlaunchAttributeID of a kernel's priority (its value: an int at the start of a 64-byte union).
_ATTRIBUTE_PRIORITY = 8
#: CUstreamCaptureStatus while a stream is capturing.
_STATUS_ACTIVE = 1

#: The capture in progress on this process (captures run one at a time, on one thread).
_ACTIVE = None

_DRIVER = None


def _driver():
    global _DRIVER
    if _DRIVER is None:
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            raise HisparseError(f"CUDA graphs need the CUDA driver library ({name}): {exc}")
        void_p, u64 = ctypes.c_void_p, ctypes.c_ulonglong
        signatures = {
            "cuStreamBeginCapture_v2": (void_p, ctypes.c_int),
            "cuStreamEndCapture": (void_p, ctypes.POINTER(void_p)),
            "cuGraphInstantiateWithFlags": (ctypes.POINTER(void_p), void_p, u64),
            "cuGraphLaunch": (void_p, void_p),
            "cuGraphExecDestroy": (void_p,),
            "cuGraphDestroy": (void_p,),
            "cuGraphGetNodes": (void_p, void_p, ctypes.POINTER(ctypes.c_size_t)),
            "cuGetErrorString": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
            # The versions of these entry points that CUDA 11.3-12.x headers name; the driver
            # keeps exporting them for binaries built then.
            "cuStreamGetCaptureInfo_v2": (void_p, ctypes.POINTER(ctypes.c_int),
                                          ctypes.POINTER(u64), ctypes.POINTER(void_p),
                                          ctypes.POINTER(void_p),
                                          ctypes.POINTER(ctypes.c_size_t)),
            "cuGraphNodeGetDependencies": (void_p, void_p, ctypes.POINTER(ctypes.c_size_t)),
            "cuGraphNodeGetType": (void_p, ctypes.POINTER(ctypes.c_int)),
            "cuGraphKernelNodeSetAttribute": (void_p, ctypes.c_int, void_p),
            "cuCtxGetStreamPriorityRange": (ctypes.POINTER(ctypes.c_int),
                                            ctypes.POINTER(ctypes.c_int)),
        }
        for symbol, argtypes in signatures.items():
            function = getattr(lib, symbol)
            function.argtypes, function.restype = list(argtypes), ctypes.c_int
        _DRIVER = lib
    return _DRIVER


def _check(result, what):
    if result != 0:
        message = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(message))
        text = message.value.decode() if message.value else f"CUresult {result}"
        raise HisparseError(f"CUDA graph: {what} failed: {text}")


def _handle(stream):
    """The raw CUstream of a PyCUDA stream."""
    return ctypes.c_void_p(int(stream.handle))


def _capture_state(stream, every_node=True):
    """``(leaves, nodes)`` of the capture in progress on ``stream``: the nodes the next work
    captured there would depend on (its last launches) and every node of the graph captured so
    far (on any stream; not listed, empty, without ``every_node``), as sets of ints; both empty
    when the stream is not capturing."""
    driver = _driver()
    status, capture_id = ctypes.c_int(0), ctypes.c_ulonglong(0)
    graph, leaves, count = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t(0)
    _check(driver.cuStreamGetCaptureInfo_v2(_handle(stream), ctypes.byref(status),
                                            ctypes.byref(capture_id), ctypes.byref(graph),
                                            ctypes.byref(leaves), ctypes.byref(count)),
           "reading a capture's state")
    if status.value != _STATUS_ACTIVE or not graph.value:
        return set(), set()
    last = set()
    if count.value and leaves.value:
        last = {int(node) for node in (ctypes.c_void_p * count.value).from_address(leaves.value)}
    return last, _graph_nodes(graph) if every_node else set()


def _graph_nodes(graph):
    """Every node of ``graph`` (a CUgraph), as ints."""
    driver, count = _driver(), ctypes.c_size_t(0)
    _check(driver.cuGraphGetNodes(graph, None, ctypes.byref(count)), "counting a graph's nodes")
    if not count.value:
        return set()
    nodes = (ctypes.c_void_p * count.value)()
    _check(driver.cuGraphGetNodes(graph, nodes, ctypes.byref(count)), "listing a graph's nodes")
    return {int(node) for node in nodes[:count.value] if node}


def _dependencies(node):
    """The nodes ``node`` (an int) depends on, as ints."""
    driver, count = _driver(), ctypes.c_size_t(0)
    _check(driver.cuGraphNodeGetDependencies(ctypes.c_void_p(node), None, ctypes.byref(count)),
           "reading a node's dependencies")
    if not count.value:
        return []
    nodes = (ctypes.c_void_p * count.value)()
    _check(driver.cuGraphNodeGetDependencies(ctypes.c_void_p(node), nodes, ctypes.byref(count)),
           "reading a node's dependencies")
    return [int(n) for n in nodes[:count.value] if n]


@contextlib.contextmanager
def background_work(streams, enabled=True):
    """Mark the work issued inside the block on ``streams`` (a stream, or several: work forked
    onto another stream inside the block) as background work of the capture in progress: it
    keeps the lowest priority when the graph replays, every other kernel gets the highest
    (module docstring). Nothing happens when no capture is in progress, or when not ``enabled``
    (``gpu.graph_priorities`` off)."""
    streams = tuple(streams) if isinstance(streams, (tuple, list)) else (streams,)
    capture = _ACTIVE if enabled else None
    before = set()
    if capture is not None:
        # Every stream in the capture lists the same graph, so the first that is in it serves
        # (a stream not yet in the capture lists nothing).
        for stream in streams:
            before = _capture_state(stream)[1]
            if before:
                break
    yield
    if capture is None:
        return
    # The block's own work: the nodes made inside it that its streams' leaves now depend on
    # (not work it made on other streams, nor what the streams waited for on them, made before).
    leaves = set()
    for stream in streams:
        leaves |= _capture_state(stream, every_node=False)[0]
    pending, seen = list(leaves - before), set(before)
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        capture.background.add(node)
        pending.extend(_dependencies(node))


def _prioritise(graph, background_nodes):
    """Give every kernel node of ``graph`` outside ``background_nodes`` the context's highest
    stream priority; returns how many were raised."""
    driver = _driver()
    least, greatest = ctypes.c_int(0), ctypes.c_int(0)
    _check(driver.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)),
           "reading the stream priority range")
    if least.value == greatest.value:  # one priority level: nothing to order
        return 0
    value = (ctypes.c_int * 16)()  # CUlaunchAttributeValue: 64 bytes, the priority first
    value[0] = greatest.value
    raised, kind = 0, ctypes.c_int(-1)
    for node in sorted(_graph_nodes(graph) - set(background_nodes)):
        _check(driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)),
               "reading a node's type")
        if kind.value == _NODE_KERNEL:
            _check(driver.cuGraphKernelNodeSetAttribute(ctypes.c_void_p(node),
                                                        _ATTRIBUTE_PRIORITY, value),
                   "setting a kernel node's priority")
            raised += 1
    return raised


class CapturedWork:
    """The work that ``issue()`` launches on ``stream``, recorded once as a CUDA graph.

    Parameters
    ----------
    stream : pycuda.driver.Stream
        The capturing stream (never the legacy default stream); :meth:`launch` replays on it.
    issue : callable
        Launches the work (no arguments); it must not wait on the host (module docstring).
    what : str
        Named in errors.

    Capturing does not run the work. A failure inside ``issue`` or an invalidated capture ends
    the capture, so the stream is usable again, and raises.
    """

    def __init__(self, stream, issue, what="work"):
        driver = _driver()
        self.stream, self.what = stream, what
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()
        #: nodes issued inside :func:`background_work` (kept at the lowest priority)
        self.background = set()
        #: kernel nodes given the highest priority
        self.raised = 0
        handle = _handle(stream)
        _check(driver.cuStreamBeginCapture_v2(handle, _CAPTURE_MODE_RELAXED),
               f"beginning the capture of {what}")
        global _ACTIVE
        _ACTIVE = self
        try:
            issue()
        except BaseException as exc:
            driver.cuStreamEndCapture(handle, ctypes.byref(self._graph))
            self._destroy_graph()
            if isinstance(exc, Exception):
                raise HisparseError(f"CUDA graph: capturing {what} failed: {exc}") from exc
            raise
        finally:
            _ACTIVE = None
        _check(driver.cuStreamEndCapture(handle, ctypes.byref(self._graph)),
               f"capturing {what} (something in it waited on the host or allocated)")
        try:
            flags = 0
            if self.background:
                self.raised = _prioritise(self._graph, self.background)
                flags = _INSTANTIATE_USE_NODE_PRIORITY
            _check(driver.cuGraphInstantiateWithFlags(ctypes.byref(self._exec), self._graph,
                                                      flags),
                   f"instantiating the graph of {what}")
        except HisparseError:
            self._destroy_graph()
            raise
        #: kernels, copies and event nodes recorded
        self.nodes = len(_graph_nodes(self._graph))

    def launch(self, stream=None):
        """Replay the recorded work on ``stream`` (default: the capturing stream); returns at
        once, like a kernel launch."""
        if not self._exec:
            raise HisparseError(f"CUDA graph of {self.what} was freed")
        _check(_driver().cuGraphLaunch(self._exec, _handle(stream or self.stream)),
               f"launching the graph of {self.what}")

    def _destroy_graph(self):
        if self._graph:
            _driver().cuGraphDestroy(self._graph)
            self._graph = ctypes.c_void_p()

    def free(self):
        """Destroy the graph (call while the context is alive; idempotent)."""
        if self._exec:
            _driver().cuGraphExecDestroy(self._exec)
            self._exec = ctypes.c_void_p()
        self._destroy_graph()


class GraphCache:
    """Work recorded once per key as a CUDA graph (:class:`CapturedWork`) and replayed after;
    a key whose recording failed is launched directly from then on, its error kept in
    :attr:`error` and logged once.

    Parameters
    ----------
    log : callable, optional
        Receives one line when a recording fails.
    """

    def __init__(self, log=None):
        self.graphs, self.failed, self.error, self.log = {}, set(), "", log

    def graph(self, key, stream, issue, what):
        """The recorded work of ``key`` (recorded now from ``issue`` on ``stream`` if new), or
        None when its recording failed, now or before: the caller launches it directly."""
        if key in self.failed:
            return None
        graph = self.graphs.get(key)
        if graph is None:
            try:
                graph = CapturedWork(stream, issue, what)
            except Exception as exc:  # any recording problem: this work launches directly
                self.failed.add(key)
                self.error = str(exc)
                if self.log is not None:
                    self.log(f"{what}: CUDA graph recording failed ({exc}); launching directly")
                return None
            self.graphs[key] = graph
        return graph

    def run(self, key, stream, issue, what):
        """Replay ``key``'s work on ``stream``, recording it first if new, or launch ``issue()``
        directly when its recording failed."""
        graph = self.graph(key, stream, issue, what)
        if graph is None:
            issue()
        else:
            graph.launch(stream)

    def drop(self, keep=lambda key: False):
        """Free the graphs whose key ``keep`` rejects (e.g. recorded for buffers about to go)."""
        for key in [k for k in self.graphs if not keep(k)]:
            self.graphs.pop(key).free()

    def free(self):
        """Free every graph (call while the context is alive)."""
        self.drop()


class ReplayPlan:
    """``count`` repetitions of one step, as at most three graphs: ``first`` once (it may
    differ from the others, e.g. a chain's first product), then ``unit`` copies of ``step``
    replayed ``(count - 1) // unit`` times, then the remainder. ``unit`` bounds the graph's size
    (instantiation time and memory grow with nodes) while one replay still covers many steps.

    Parameters
    ----------
    stream : pycuda.driver.Stream
    first, step : callable
        Issue the first step and every later one (no arguments).
    count : int
        Steps per replay, >= 1.
    unit : int
        Most steps per recorded graph.
    """

    def __init__(self, stream, first, step, count, unit=64, what="steps"):
        if count < 1:
            raise ValueError("count must be >= 1")
        self.stream = stream
        rest = count - 1
        self.unit = max(1, min(unit, rest)) if rest else 0
        self.unit_launches, remainder = divmod(rest, self.unit) if rest else (0, 0)
        self.graphs = []
        self.first = self._record(first, 1, f"{what} (first)")
        self.block = (self._record(step, self.unit, f"{what} ({self.unit} steps)")
                      if self.unit_launches else None)
        self.tail = self._record(step, remainder, f"{what} ({remainder} steps)") \
            if remainder else None

    def _record(self, step, repeats, what):
        def issue():
            for _ in range(repeats):
                step()
        graph = CapturedWork(self.stream, issue, what)
        self.graphs.append(graph)
        return graph

    def _per_launch(self, attribute):
        """``attribute`` of the recorded graphs summed over one call of :meth:`launch`."""
        total = getattr(self.first, attribute)
        if self.block is not None:
            total += getattr(self.block, attribute) * self.unit_launches
        if self.tail is not None:
            total += getattr(self.tail, attribute)
        return total

    @property
    def nodes(self):
        """Nodes replayed per call of :meth:`launch`."""
        return self._per_launch("nodes")

    @property
    def raised(self):
        """Kernel nodes replayed at the highest priority per call of :meth:`launch`."""
        return self._per_launch("raised")

    def launch(self):
        """Replay all ``count`` steps (asynchronous)."""
        self.first.launch()
        for _ in range(self.unit_launches):
            self.block.launch()
        if self.tail is not None:
            self.tail.launch()

    def free(self):
        for graph in self.graphs:
            graph.free()
        self.graphs = []
