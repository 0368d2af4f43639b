"""Shutdown: every step runs whatever the others did, and SIGTERM ends the broker within a
bound even after hostile streams."""

from __future__ import annotations

import signal
import subprocess
import threading

import grpc
import pytest
from test_broker_harness import BrokerProcess, create_topic, raw_stub

from stratamq.broker.server import Broker, BrokerStopError
from stratamq.config import BrokerConfig, StoreConfig
from stratamq.store.message_store import MessageStore


def test_a_failing_shutdown_step_still_closes_the_store(tmp_path):
    root = tmp_path / "store"
    b = Broker(StoreConfig(store_path_root_dir=str(root)), BrokerConfig(), "127.0.0.1:0")
    b.start()
    assert (root / "abort").exists()
    # The pop state's RocksDB is gone underneath the broker (as after a disk error): closing
    # it fails, and the store must be closed all the same.
    b.state.db.close()
    with pytest.raises(BrokerStopError) as err:
        b.stop()
    assert [name for name, _exc in err.value.errors] == ["closing the pop state"]
    assert not (root / "abort").exists()  # the store closed cleanly: no recovery next time
    with MessageStore(StoreConfig(store_path_root_dir=str(root))).open() as store:
        assert store.recovery.abnormal is False


def test_sigterm_after_undecodable_telemetry_frames_stops_within_the_grace(tmp_path):
    b = BrokerProcess(tmp_path / "store").start()
    create_topic(b, "Hostile", 1)
    channel = grpc.insecure_channel(b.endpoint)
    raw = channel.stream_stream("/apache.rocketmq.v2.MessagingService/Telemetry",
                                request_serializer=lambda x: x,
                                response_deserializer=lambda x: x)
    hold = threading.Event()

    def frames():
        yield b"\xff\xff\xff not a protobuf"
        hold.wait(60)  # the client keeps its half of the stream open

    streams = [raw(frames()) for _ in range(4)]
    errors = []
    for stream in streams:
        try:
            next(iter(stream))
        except grpc.RpcError as exc:
            errors.append(exc.code())
    assert errors == [grpc.StatusCode.INVALID_ARGUMENT] * 4
    # An ordinary call still works, then SIGTERM: the broker exits on its own, cleanly.
    _channel, stub = raw_stub(b)
    b.proc.send_signal(signal.SIGTERM)
    try:
        code = b.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        b.kill()
        pytest.fail("the broker did not stop within 60 s of SIGTERM")
    finally:
        hold.set()
        channel.close()
    assert code == 0
    assert not (tmp_path / "store" / "abort").exists()


def test_a_burst_of_stop_signals_still_stops_the_broker_cleanly(tmp_path):
    """Impatient supervisors send SIGTERM (and SIGINT) again and again: every one of them may
    land while the main thread is inside its wait, and the broker must still stop, once, with
    its store closed (a handler taking a lock there deadlocked the broker for good)."""
    b = BrokerProcess(tmp_path / "store").start()
    create_topic(b, "Burst", 1)
    sent = 0
    while b.proc.poll() is None and sent < 20000:  # until it is gone (or plainly stuck)
        try:
            b.proc.send_signal(signal.SIGTERM if sent % 2 else signal.SIGINT)
        except ProcessLookupError:
            break
        sent += 1
    try:
        code = b.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        b.kill()
        pytest.fail("the broker did not stop within 60 s of a burst of stop signals")
    out = b.proc.stdout.read()
    b.proc.stdout.close()
    assert code == 0, out
    assert "stopped cleanly" in out
    assert not (tmp_path / "store" / "abort").exists()
