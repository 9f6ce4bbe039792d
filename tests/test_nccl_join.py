"""The NCCL communicator made on a thread of its own while the run reads its input
(hisparse.parallel._nccl): the transport's first use waits for it, a failed join raises where
the communicator is wanted, a join that never ends is an error after parallel.timeout_s, and the
thread makes the caller's GPU current before joining. A fake NCCL module stands in for CuPy's."""
import threading
import time

import pytest

from hisparse.errors import HisparseError
from hisparse.parallel import _nccl


class _Comm:
    rank, size = 0, 2

    def bcast(self, value, root=0):
        return value


class _FakeNccl:
    """What NcclTransport.open calls of the NCCL binding; the communicator records the thread and
    the device current when it was made, and may be slowed down or made to fail."""

    def __init__(self, delay=0.0, error=None):
        self.delay, self.error, self.made = delay, error, []

    def get_unique_id(self):
        return (1, 2, 3)

    def NcclCommunicator(self, size, uid, rank):  # noqa: N802 - CuPy's name
        time.sleep(self.delay)
        if self.error is not None:
            raise self.error
        self.made.append((threading.current_thread().name, _DEVICE["current"], size, uid, rank))
        return _FakeCommunicator()


class _FakeCommunicator:
    destroyed = False

    def destroy(self):
        self.destroyed = True


_DEVICE = {}


@pytest.fixture
def fake(monkeypatch):
    def install(**kwargs):
        nccl = _FakeNccl(**kwargs)
        monkeypatch.setattr(_nccl, "_nccl_module", lambda: nccl)
        monkeypatch.setattr(_nccl, "nccl_channel_limit", lambda channels: None)
        _DEVICE.clear()
        _DEVICE["current"] = None
        monkeypatch.setattr(_nccl, "_current_device", lambda: 3)
        monkeypatch.setattr(_nccl, "_make_current", lambda d: _DEVICE.__setitem__("current", d))
        return nccl
    return install


def test_a_background_join_runs_on_its_own_thread_with_the_callers_gpu(fake):
    nccl = fake(delay=0.2)
    started = time.perf_counter()
    transport = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30, "background": True})
    assert time.perf_counter() - started < 0.15  # open returned while the join went on
    assert not nccl.made
    transport.ready()
    assert len(nccl.made) == 1
    thread, device, size, uid, rank = nccl.made[0]
    assert thread == "hisparse-nccl-join" and device == 3 and (size, uid, rank) == (2, (1, 2, 3), 0)
    communicator = transport.nccl
    transport.close()
    assert communicator.destroyed and transport.nccl is None


def test_the_first_use_waits_for_the_join_and_a_blocking_open_needs_no_thread(fake):
    nccl = fake(delay=0.1)
    transport = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30, "background": True})
    assert isinstance(transport.nccl, _FakeCommunicator)  # the property waited
    blocking = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30})
    assert nccl.made[-1][0] == threading.current_thread().name
    assert isinstance(blocking.nccl, _FakeCommunicator)


def test_a_failed_join_raises_where_the_communicator_is_wanted(fake):
    fake(error=RuntimeError("NCCL error: unhandled system error"))
    transport = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30, "background": True})
    with pytest.raises(RuntimeError, match="unhandled system error"):
        transport.ready()
    transport.close()  # nothing to destroy, no second raise


def test_a_join_that_never_ends_is_an_error_after_the_timeout(fake):
    fake(delay=5.0)
    transport = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 0.2, "background": True})
    with pytest.raises(HisparseError, match="parallel.timeout_s"):
        transport.ready()


@pytest.mark.parametrize("connect_early", [True, False])
def test_the_join_thread_makes_the_pair_connections_when_asked(fake, monkeypatch, connect_early):
    """With connect_early the join thread runs the connecting exchange on the communicator it
    made, before the transport is ready (so the operation's first exchange does not pay for
    NCCL's lazy connections); without it, never. A failing connection raises where the
    communicator is wanted."""
    nccl = fake()
    calls = []

    def connect(module, communicator, size, rank):
        calls.append((threading.current_thread().name, module, communicator, size, rank))
    monkeypatch.setattr(_nccl, "_connect_pairs", connect)
    transport = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30, "background": True,
                                                   "connect_early": connect_early})
    transport.ready()
    if connect_early:
        assert calls == [("hisparse-nccl-join", nccl, transport.nccl, 2, 0)]
    else:
        assert calls == []

    def fails(*args):
        raise RuntimeError("NCCL error: remote process exited")
    monkeypatch.setattr(_nccl, "_connect_pairs", fails)
    failing = _nccl.NcclTransport.open(_Comm(), {"timeout_s": 30, "background": True,
                                                 "connect_early": True})
    with pytest.raises(RuntimeError, match="remote process exited"):
        failing.ready()


@pytest.mark.parametrize("setting", ["auto", True, False])
def test_connect_early_auto_takes_the_operations_choice(monkeypatch, setting):
    """``parallel.connect_early: auto`` hands the transport the operation's CONNECT_EARLY (SpMV,
    whose read and plan hide the connections: on; the others: off) when every rank is on one
    node, off across nodes (a node communicator smaller than the world); true and false win
    over it."""
    from hisparse.ops import get_operation_class
    from hisparse.parallel import _transport
    from hisparse.parallel import get_world, node_local
    asked = {}

    def made(comm, kind, timeout, channels, background, connect_early):
        asked[kind] = connect_early
    monkeypatch.setattr(_transport, "make_transport", made)
    comm = get_world()
    settings = {"transport": "auto", "timeout_s": 30.0, "nccl_channels": "auto",
                "connect_early": setting}
    class OtherNode:  # a node communicator that holds fewer ranks than the world
        size = comm.size + 1

    for name, auto in (("spmv", True), ("spgemm", False), ("cpals", False)):
        op_cls = get_operation_class(name)
        assert op_cls.CONNECT_EARLY is auto
        for local, on_one_node in ((node_local(comm), True), (OtherNode(), False)):
            asked.clear()
            _transport.open_transport(comm, local, "cpu", settings, op_cls)
            want = (auto and on_one_node) if setting == "auto" else setting
            assert list(asked.values()) == [want], (name, on_one_node)


def test_connect_early_takes_only_true_false_or_auto(tmp_path):
    """The config names the key and the values it takes."""
    from hisparse.config import load_config
    from hisparse.errors import ConfigError

    from helpers import write_config
    config = write_config(tmp_path, "spmv", {}, input={"generate": {"kind": "poisson",
                                                                    "dims": [4, 4, 4]}},
                          backend="cpu")
    assert load_config(str(config))["parallel.connect_early"] == "auto"
    assert load_config(str(config), ["parallel.connect_early=false"])[
        "parallel.connect_early"] is False
    with pytest.raises(ConfigError, match=r"connect_early.*true, false or auto"):
        load_config(str(config), ["parallel.connect_early=sometimes"])


@pytest.mark.parametrize("operation", ["spmv", "spgemm"])
def test_the_driver_waits_for_the_connection_where_the_operation_says(tmp_path, monkeypatch,
                                                                      operation):
    """SpMV (CONNECTS_IN_SETUP) waits for the transport's connection in its setup, after its
    plan and upload and before its first device collective (the exchange probe), so that the
    connection goes on under them; another operation waits once its input is read, before its
    setup. The driver asks once more after the setup (at once then). A whole 1-rank CPU run
    with a transport that records when it is waited for."""
    from hisparse import driver
    from hisparse.ops import get_operation_class
    from hisparse.parallel import MpiTransport

    from helpers import write_config
    events = []

    class Recording(MpiTransport):
        def ready(self):
            events.append("ready")

    monkeypatch.setattr(driver, "open_transport",
                        lambda comm, *args: Recording(comm))
    op_cls = get_operation_class(operation)
    setup = op_cls.setup

    def recorded_setup(self, problem):
        events.append("setup")
        return setup(self, problem)
    monkeypatch.setattr(op_cls, "setup", recorded_setup)
    if operation == "spmv":
        probe = op_cls._probe_exchange

        def recorded_probe(self, *args):
            events.append("probe")
            return probe(self, *args)
        monkeypatch.setattr(op_cls, "_probe_exchange", recorded_probe)
    config = write_config(tmp_path, operation, {"x": "ones"} if operation == "spmv" else {},
                          input={"generate": {"kind": "poisson", "dims": [6, 5, 4]}},
                          backend="cpu", verify={"enabled": False})
    driver.run(str(config))
    expected = ["setup", "ready", "probe", "ready"] if operation == "spmv" else \
        ["ready", "setup", "ready"]
    assert events == expected


def test_the_binding_falls_back_to_cupys_module_and_says_what_is_missing(monkeypatch):
    """The NCCL binding is the first of NCCL_MODULES that imports (the back-end module alone,
    else CuPy's); none importable: one line naming the transport and the fix, not a traceback."""
    monkeypatch.setattr(_nccl, "NCCL_MODULES", ("hisparse_no_such_binding", "json"))
    import json
    assert _nccl._nccl_module() is json
    monkeypatch.setattr(_nccl, "NCCL_MODULES", ("hisparse_no_such_binding",) * 2)
    with pytest.raises(HisparseError, match="parallel.transport: nccl needs CuPy with NCCL"):
        _nccl._nccl_module()
