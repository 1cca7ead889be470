"""traces.run.transport: generic packing of records, the shared-memory ring, the control channel and the
one-round-in-flight flow control, between two threads over a real socket pair and memfd."""

from __future__ import annotations

import os
import socket
import threading

import numpy as np
import pytest

from mtpscope.errors import TraceError
from mtpscope.traces.run.packing import pack, unpack
from mtpscope.traces.run.transport import (
    COPY_BELOW,
    Channel,
    Ring,
    RoundReceiver,
    RoundSender,
    StopRequested,
    TransportClosed,
)
from mtpscope.traces.store.records import RoundRecord, StepRecord


def _step(k: int, dim: int) -> StepRecord:
    rng = np.random.default_rng(k)
    return StepRecord(k=k, token=10 + k, logit=1.5, top_ids=(10 + k, 3), top_logits=(1.5, -2.0),
                      target_token=None, accepted=k == 1, h=rng.standard_normal(dim).astype(np.float32),
                      h_next=None, h_inner=np.arange(dim, dtype=np.float32))


def test_pack_unpack_round_trip() -> None:
    s = _step(1, 8)
    header, arrays = pack(s)
    assert len(arrays) == 2 and arrays[0] is s.h                      # arrays by reference, in field order
    assert header["__type__"] == "mtpscope.traces.store.records:StepRecord"
    back = unpack(header, arrays)
    assert isinstance(back, StepRecord) and back.top_ids == (11, 3) and back.top_logits == (1.5, -2.0)
    assert back.h_next is None and back.target_token is None and back.accepted is True
    np.testing.assert_array_equal(back.h_inner, s.h_inner)
    r = RoundRecord(prompt_id=0, round=2, pos=9, pending_token=4, n_draft=2, drafted=(5, 6), n_accepted=1,
                    target=(5, 7, None), emitted=(5, 7), t_draft_ms=float("nan"))
    h, a = pack(r)
    assert a == [] and unpack(h, a).target == (5, 7, None) and np.isnan(unpack(h, a).t_draft_ms)


def test_unpack_refuses_foreign_types_and_bad_indices() -> None:
    with pytest.raises(TraceError, match="outside mtpscope"):
        unpack({"__type__": "subprocess:Popen", "fields": {}}, [])
    with pytest.raises(TraceError, match="not a dataclass"):
        unpack({"__type__": "mtpscope.traces.run.transport:Ring", "fields": {}}, [])
    with pytest.raises(TraceError, match="does not carry"):
        unpack({"__array__": 3}, [np.zeros(1)])
    with pytest.raises(TypeError, match="cannot pack"):
        pack(StepRecord(k=1, token=1, top_ids=None, logit=object()))  # type: ignore[arg-type]  # an unpackable logit on purpose


def test_ring_layout_copies_and_views() -> None:
    ring = Ring.create(4 << 20)
    try:
        small = np.arange(5, dtype=np.int16)
        big = np.linspace(0, 1, COPY_BELOW // 4 + 1, dtype=np.float32)   # just over the copy threshold
        specs, need = Ring.layout([small, big])
        assert specs[0].offset == 0 and specs[1].offset == 64 and need == 64 + -(-big.nbytes // 64) * 64
        ring.write(1, [small, big], specs)
        a, b = ring.read(1, specs)
        np.testing.assert_array_equal(a, small)
        np.testing.assert_array_equal(b, big)
        assert a.flags.writeable and a.base is None                     # a copy: the record may keep it
        assert not b.flags.writeable                                    # a view into slot 1
        ring.write(1, [small, big * 0], specs)
        assert a[4] == 4 and b[-1] == 0.0                               # the copy stayed, the view changed
        bad = [type(specs[0])(ring.slot_bytes - 8, "<f4", (4,))]
        with pytest.raises(TraceError, match="outside its ring slot"):
            ring.read(0, bad)
    finally:
        del a, b
        ring.close()


def test_channel_messages_fds_and_eof() -> None:
    a, b = socket.socketpair()
    ca, cb = Channel(a), Channel(b)
    r, w = os.pipe()
    try:
        def send_all() -> None:
            ca.send({"kind": "x", "n": 1})
            ca.send({"kind": "fd"}, fds=[w])
            ca.send({"kind": "y", "text": "é" * 1_000_000})            # more than the socket buffer
        t = threading.Thread(target=send_all)
        t.start()
        m1, f1 = cb.recv()
        m2, f2 = cb.recv()
        m3, _ = cb.recv()
        assert (m1["kind"], m1["n"], f1) == ("x", 1, [])
        assert m2["kind"] == "fd" and len(f2) == 1
        os.write(f2[0], b"ok")                                          # the received fd is the pipe's
        assert os.read(r, 2) == b"ok"
        os.close(f2[0])
        assert m3["text"] == "é" * 1_000_000
        t.join()
        assert cb.recv(timeout=0.05) is None
        ca.close()
        with pytest.raises(TransportClosed):
            cb.recv(timeout=1.0)
    finally:
        cb.close()
        os.close(r)
        os.close(w)


def test_channel_ready_looks_without_taking() -> None:
    """``ready`` says whether a whole message waits, reading the socket but taking nothing: a half-sent message is
    not ready, the next ``recv`` still returns the messages in order, and a closed peer reads as an error."""
    a, b = socket.socketpair()
    ca, cb = Channel(a), Channel(b)
    try:
        assert not cb.ready()
        body = b'{"kind":"x","n":1,"n_fds":0}'
        a.sendall(len(body).to_bytes(4, "little") + body[:5])           # half a message
        assert not cb.ready()
        a.sendall(body[5:])
        ca.send({"kind": "y"})
        assert cb.ready() and cb.ready()                                 # looking twice takes nothing
        assert cb.recv()[0]["kind"] == "x" and cb.recv()[0]["kind"] == "y"
        assert not cb.ready()
        bad = b"{not json"
        a.sendall(len(bad).to_bytes(4, "little") + bad)
        with pytest.raises(TraceError, match="not JSON"):          # said at once: its bytes are gone after
            cb.ready()
        ca.close()
        with pytest.raises(TransportClosed):
            cb.ready()
    finally:
        cb.close()


def test_sender_receiver_one_round_in_flight() -> None:
    """Arrays of all sizes arrive intact (the ring grows when a round does not fit), and the sender
    never has more than one unreleased message at the receiver."""
    a, b = socket.socketpair()
    sender, receiver = RoundSender(Channel(a)), RoundReceiver(Channel(b))
    dims = [16, 300_000, 16, 1_000_000, 64]            # 1.2 MB then 4 MB of h: two ring growths
    ahead: list[int] = []
    err: list[BaseException] = []

    def produce() -> None:
        try:
            for i, d in enumerate(dims):
                sender.send("round", _step(i + 1, d), prompt_id=7)
            sender.send("round", _step(9, 8))
            sender._wait_released(sender.n_sent + 1)     # never comes: a stop does
        except StopRequested:
            sender.chan.send({"kind": "stopped"})
        except BaseException as e:  # noqa: BLE001  # anything the producer thread raises is handed to the test
            err.append(e)

    t = threading.Thread(target=produce)
    t.start()
    got = []
    while len(got) < len(dims):
        msg, fds = receiver.chan.recv(timeout=30)
        if msg["kind"] == "ring":
            receiver.on_ring(msg, fds)
            continue
        assert msg["kind"] == "round" and msg["prompt_id"] == 7
        s = receiver.unpack(msg)
        want = _step(len(got) + 1, dims[len(got)])
        np.testing.assert_array_equal(s.h, want.h)
        assert s.k == want.k
        ahead.append(sender.n_sent - receiver.n_released)
        got.append(s.h.nbytes)
        receiver.release()
    # the last round is not released: ask to stop instead; the sender stops before sending another
    receiver.chan.send({"kind": "stop"})
    msg, _ = receiver.chan.recv(timeout=30)
    while msg["kind"] == "round":      # the 6th round may already be on its way
        receiver.release()
        msg, _ = receiver.chan.recv(timeout=30)
    t.join(30)
    assert not err, err
    assert msg["kind"] == "stopped"
    assert max(ahead) <= 1
    sender.close()
    receiver.close()


def _recv_one(receiver: RoundReceiver, out: list) -> None:
    """Receive the next round message (mapping a ring that comes first), keep ``(message, object)`` in ``out``, release it."""
    while True:
        msg, fds = receiver.chan.recv(timeout=30)
        if msg["kind"] == "ring":
            receiver.on_ring(msg, fds)
            continue
        out.append((msg, receiver.unpack(msg)))
        receiver.release()
        return


def test_staged_arrays_are_sent_from_where_they_lie() -> None:
    """``stage`` copies an array straight into the next message's slot; ``send`` then keeps it there
    (its spec points at it) and copies only the rest; before any ring exists it is a plain copy."""
    a, b = socket.socketpair()
    sender, receiver = RoundSender(Channel(a)), RoundReceiver(Channel(b))
    big = np.arange(100_000, dtype=np.float32)
    first = sender.stage(big)
    assert first.base is None and np.array_equal(first, big)      # no ring yet: a copy of its own
    out: list = []

    def recv_one() -> None:
        _recv_one(receiver, out)

    for i in range(3):
        staged = sender.stage(big + i)
        s = StepRecord(k=1, token=i, h=staged, h_inner=np.full(4, i, np.float32))
        t = threading.Thread(target=recv_one)
        t.start()
        sender.send("round", s)
        t.join(30)
        msg, got = out[-1]
        np.testing.assert_array_equal(got.h, big + i)
        np.testing.assert_array_equal(got.h_inner, np.full(4, i))
        if i > 0:       # the ring existed when it was staged: sent from offset 0 of its slot, not copied
            ring = sender.ring
            assert msg["arrays"][0][0] == 0
            assert staged.ctypes.data - ring.address - msg["slot"] * ring.slot_bytes == 0
    sender.close()
    receiver.close()


def test_stage_with_fills_the_slot_and_returns_what_fill_computed() -> None:
    """``stage_with(a, fill)``: ``fill`` writes the copy into the next message's slot (and its result comes
    back beside the copy), which is then sent from where it lies; before any ring, ``fill`` gets an array of
    its own."""
    a, b = socket.socketpair()
    sender, receiver = RoundSender(Channel(a)), RoundReceiver(Channel(b))
    big = np.arange(100_000, dtype=np.float32)

    def fill(src: np.ndarray, dst: np.ndarray) -> float:
        np.copyto(dst, src)
        return float(src[-1])

    first, got0 = sender.stage_with(big, fill)
    assert first.base is None and np.array_equal(first, big) and got0 == 99_999.0
    sender.reserve(1 << 20)
    out: list = []
    staged, got = sender.stage_with(big + 1, fill)
    assert got == 100_000.0
    t = threading.Thread(target=_recv_one, args=(receiver, out))
    t.start()
    sender.send("round", StepRecord(k=1, token=1, h=staged))
    t.join(30)
    msg, rec = out[-1]
    np.testing.assert_array_equal(rec.h, big + 1)
    assert staged.ctypes.data - sender.ring.address - msg["slot"] * sender.ring.slot_bytes == msg["arrays"][0][0]
    sender.close()
    receiver.close()


def test_prepare_runs_on_the_sender_thread_before_the_fence() -> None:
    """``prepare`` replaces the object before its arrays go into the ring, on the sender thread; ``fence`` returns
    only after it ran, so a buffer it read (here a view that is overwritten right after the fence) is read intact."""
    import dataclasses

    a, b = socket.socketpair()
    seen: list[str] = []
    buf = np.arange(50_000, dtype=np.float32)       # llama.cpp's logits buffer, in the recording worker

    def prepare(kind: str, obj: StepRecord) -> StepRecord:
        seen.append(threading.current_thread().name)
        # what the worker does with the verify rows: reduce the live view, send the result instead
        return dataclasses.replace(obj, logit=float(np.asarray(obj.h, dtype=np.float64).sum()), h=None)

    sender = RoundSender(Channel(a), threaded=True, prepare=prepare)
    receiver = RoundReceiver(Channel(b))
    sender.send("round", StepRecord(k=1, token=3, h=buf[:1000], h_inner=np.ones(4, np.float32)))
    sender.fence()
    buf[:] = -1.0                                    # the next decode overwrites the buffer
    while True:
        msg, fds = receiver.chan.recv(timeout=30)
        if msg["kind"] == "ring":
            receiver.on_ring(msg, fds)
            continue
        got = receiver.unpack(msg)
        break
    receiver.release()
    assert seen == ["mtpscope-round-sender"]
    assert got.logit == sum(range(1000)) and got.h is None       # the sum of 0..999 by hand: 499500
    np.testing.assert_array_equal(got.h_inner, np.ones(4))
    sender.close()
    receiver.close()


def test_doorbell_wakes_the_receiver_for_rounds_in_fours(monkeypatch) -> None:
    """Six slots, a doorbell every 4 rounds: the receiver sleeping in ``wait`` is woken only once round 3 is in the
    socket (then rounds 0-3 are all there), the plain message after round 5 wakes it at once, releases go back in
    one message per batch, the sender never has more than 5 (n_slots - 1) rounds unreleased, and closing the
    sender closes the doorbell: the receiver then reads the socket to its end."""
    import time

    from mtpscope.traces.run import transport

    monkeypatch.setattr(transport, "WAKE_AFTER_S", 60.0)     # (a slow machine must not ring it early)
    a, b = socket.socketpair()
    sender = RoundSender(Channel(a), n_slots=6, wake_every=4, batch_kinds=frozenset({"round"}))
    receiver = RoundReceiver(Channel(b), defer_release=True)
    sent_at: list[float] = []
    err: list[BaseException] = []
    release_msgs: list[int] = []
    real_handle = sender._handle

    def count_release(msg, fds):
        if msg.get("kind") == "release":
            release_msgs.append(int(msg["n"]))
        real_handle(msg, fds)

    sender._handle = count_release
    sender.reserve(1 << 16)

    def produce() -> None:
        try:
            for i in range(6):
                time.sleep(0.3 if i == 4 else 0.03)      # (round 4 well after the first batch is handled)
                sender.send("round", _step(i + 1, 16))
                sent_at.append(time.monotonic())
            sender.post({"kind": "done"})
            sender._wait_released(6)
            sender.close()
            sender.chan.close()
        except BaseException as e:  # noqa: BLE001  # handed to the test
            err.append(e)

    t = threading.Thread(target=produce)
    t.start()
    woke: list[tuple[float, int]] = []      # (when, messages already parsed then, this one included)
    got: list[str] = []
    ahead: list[int] = []
    while True:
        try:
            m = receiver.wait(timeout=10)
        except TransportClosed:
            break
        if m is None:
            continue
        msg, fds = m
        if msg["kind"] == "ring":
            receiver.on_ring(msg, fds)
            assert receiver.bell is not None and receiver.ring is not None and receiver.ring.n_slots == 6
            continue
        woke.append((time.monotonic(), 1 + len(receiver.chan._msgs)))
        got.append(msg["kind"])
        if msg["kind"] == "round":
            assert receiver.unpack(msg).k == len([k for k in got if k == "round"])
            ahead.append(sender.n_sent - receiver.n_released)
            receiver.release()
    t.join(30)
    assert not err, err
    assert got == ["round"] * 6 + ["done"]
    assert woke[0][0] >= sent_at[3] and woke[0][1] == 4       # the first wake: rounds 0-3 at once
    assert release_msgs[0] == 4                               # released in one message
    assert max(ahead) <= 5
    assert receiver.bell is None                              # closed with the sender, dropped
    receiver.close()


def test_ring_of_more_slots_refuses_a_slot_past_its_last() -> None:
    ring = Ring.create(4096, n_slots=3)
    try:
        assert ring.n_slots == 3 and len(ring.mm) == 3 * ring.slot_bytes
        specs, _ = Ring.layout([np.zeros(4, np.float32)])
        ring.write(2, [np.arange(4, dtype=np.float32)], specs)
        np.testing.assert_array_equal(ring.read(2, specs)[0], np.arange(4))
        with pytest.raises(TraceError, match="outside its ring slot"):
            ring.read(3, specs)
    finally:
        ring.close()
    with pytest.raises(ValueError, match="n_slots >= 2"):
        RoundSender(Channel(socket.socketpair()[0]), n_slots=1)
