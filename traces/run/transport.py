"""Transport between the recording worker (child process running llama.cpp) and the recorder.

Two channels, both inherited file descriptors (no names, nothing to clean up when a process dies):

* **control**: an ``AF_UNIX`` stream socket pair. A message is a 4-byte little-endian length and a
  UTF-8 JSON object with a ``"kind"``; file descriptors travel with a message as ``SCM_RIGHTS``
  ancillary data (:func:`socket.send_fds`), counted by its ``"n_fds"``.
* **data**: a shared-memory :class:`Ring` (``memfd_create``, or an unlinked temporary file where that
  is missing) of ``n_slots`` slots (two unless asked for more). A round's numpy arrays (drafter logits: 1 MiB per step at a 262144-token
  vocabulary; hidden states: a few KiB) are copied into a slot once and only their
  ``(dtype, shape, offset)`` go over the socket, so the cost in the worker's loop is one ``memcpy``
  per array plus one small ``send``.

Rounds are packed by :mod:`traces.run.packing` (any frozen dataclass: a JSON header and its arrays).

Flow control (:class:`RoundSender` / :meth:`RoundReceiver.release`): with ``S`` slots the worker writes
round ``n`` into slot ``n % S`` and sends it once the recorder has released round ``n - S + 1``; so the
recorder holds at most ``S - 1`` rounds, the trace never lags the runtime by more than that, and a slot is
never overwritten while it is read (its last round, ``n - S``, was released before round ``n - 1`` was sent).
With two slots (the default) the recorder holds one round, the one it is analysing and writing, while
llama.cpp computes the next.

Waking the recorder (``wake_every``): a receiver that blocks on the socket wakes for every message, and on a
small pair a round is only ~20 ms of llama.cpp, so each wake-up (the scheduler, caches gone cold since the last
round) is a real part of tracing's CPU. With ``wake_every = B`` the sender passes the recorder the read end of a
pipe, the **doorbell**, with the ring, and the recorder sleeps on it instead of the socket: every message still
goes into the socket at once (the kernel keeps it if the worker dies), but the bell rings only after ``B``
rounds, for any other message, at least every :data:`WAKE_AFTER_S`, and before the sender waits for a release.
The recorder then handles every message waiting and releases them with one message
(:meth:`RoundReceiver.flush_releases`). A worker that dies closes the pipe, which wakes the recorder too.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import queue
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, overload

import numpy as np

from mtpscope.errors import TraceError
from mtpscope.traces.run.packing import pack, unpack

#: arrays smaller than this are copied out of the ring on receipt (the records keep them); larger
#: ones (the drafter's logits) are views into the ring, valid until :meth:`RoundReceiver.release`
COPY_BELOW = 256 << 10
_ALIGN = 64
_LEN = struct.Struct("<I")
#: the largest control message accepted (a JSON header; arrays go through the ring)
MAX_MESSAGE = 64 << 20
#: bytes asked of the socket per receive: a round's message is about 1.5 KiB; a longer one (the job, the
#: hello) arrives in several receives. (Python allocates the whole buffer for every receive: 1 MiB cost
#: about 11 us more a message than this.)
RECV_BYTES = 64 << 10
#: with a doorbell (``wake_every`` > 1): the longest the recorder is left asleep while rounds arrive (a slow pair's
#: rounds reach the trace, and its progress, this often at least). A second lets a pair of real size (rounds of
#: 0.2-0.3 s on a CPU) hand over rounds in fours at least, which the recorder analyses together (its derived h_inner's
#: solve in one product: 6.7 -> 4.2 ms of recorder CPU per round on the 26B-A4B-geometry pair, 0.25 s before)
WAKE_AFTER_S = 1.0


T = TypeVar("T")


def _copy_into(src: np.ndarray, dst: np.ndarray) -> None:
    np.copyto(dst, src)


class TransportClosed(EOFError):
    """The other process closed its end (it exited or died)."""


# ------------------------------------------------------------------------------------------ ring
def _anonymous_fd(size: int, name: str) -> int:
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(name, getattr(os, "MFD_CLOEXEC", 0))
    else:  # pragma: no cover - macOS: an unlinked temporary file
        import tempfile

        fd, path = tempfile.mkstemp(prefix=name)
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


@dataclass(frozen=True)
class ArraySpec:
    """Where one array lies in a ring slot: ``offset`` bytes into the slot, numpy ``dtype`` / ``shape``."""

    offset: int
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.shape)    # (math.prod: ~50x cheaper than np.prod here)


class Ring:
    """``n_slots`` equal slots of shared memory behind one file descriptor.

    Args:
        fd: the memory's file descriptor (the ring takes ownership).
        slot_bytes: size of one slot.
        n_slots: how many slots (2 or more).
    """

    def __init__(self, fd: int, slot_bytes: int, n_slots: int = 2) -> None:
        self.fd = fd
        self.slot_bytes = int(slot_bytes)
        self.n_slots = int(n_slots)
        self.mm = mmap.mmap(fd, self.n_slots * self.slot_bytes)
        self._u8: np.ndarray | None = np.frombuffer(self.mm, dtype=np.uint8)
        self.address = int(self._u8.ctypes.data)

    @classmethod
    def create(cls, slot_bytes: int, n_slots: int = 2) -> Ring:
        """A new ring with ``n_slots`` slots of ``slot_bytes`` (rounded up to a page)."""
        page = mmap.PAGESIZE
        slot = max(page, -(-int(slot_bytes) // page) * page)
        return cls(_anonymous_fd(n_slots * slot, "mtpscope-ring"), slot, n_slots)

    @staticmethod
    def layout(arrays: Sequence[np.ndarray]) -> tuple[list[ArraySpec], int]:
        """Offsets of ``arrays`` packed into one slot (64-byte aligned) and the bytes they need."""
        specs, off = [], 0
        for a in arrays:
            specs.append(ArraySpec(off, a.dtype.str, tuple(int(x) for x in a.shape)))
            off += -(-a.nbytes // _ALIGN) * _ALIGN
        return specs, off

    def write(self, slot: int, arrays: Sequence[np.ndarray], specs: Sequence[ArraySpec],
              skip: set[int] | frozenset[int] = frozenset()) -> None:
        """Copy ``arrays`` into ``slot`` at ``specs`` (from :meth:`layout`), all but the indices in
        ``skip`` (arrays :meth:`RoundSender.stage` already put there)."""
        base = slot * self.slot_bytes
        for i, (a, s) in enumerate(zip(arrays, specs, strict=True)):
            if i in skip:
                continue
            dst = np.ndarray(s.shape, dtype=s.dtype, buffer=self.mm, offset=base + s.offset)
            np.copyto(dst, a, casting="no")

    def read(self, slot: int, specs: Sequence[ArraySpec], copy_below: int = COPY_BELOW) -> list[np.ndarray]:
        """The arrays of ``slot``: copies when smaller than ``copy_below`` bytes, else read-only views.

        Raises:
            TraceError: a spec outside the slot.
        """
        base = slot * self.slot_bytes
        out = []
        for s in specs:
            if not (0 <= slot < self.n_slots) or s.offset < 0 or s.offset + s.nbytes > self.slot_bytes:
                raise TraceError("transport array lies outside its ring slot", key="arrays",
                                 expected=f"within {self.slot_bytes} bytes", actual=f"{s.offset}+{s.nbytes}")
            v = np.ndarray(s.shape, dtype=s.dtype, buffer=self.mm, offset=base + s.offset)
            if s.nbytes < copy_below:
                v = v.copy()
            else:
                v.flags.writeable = False
            out.append(v)
        return out

    def close(self) -> None:
        self._u8 = None
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with the process
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ------------------------------------------------------------------------------------------ control
class Channel:
    """Length-prefixed JSON messages (and file descriptors) over a connected ``AF_UNIX`` socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._fds: deque[int] = deque()
        self._msgs: deque[tuple[dict[str, Any], list[int]]] = deque()

    def send(self, msg: dict[str, Any], fds: Sequence[int] = ()) -> None:
        """Send one message (``fds`` ride along; ``msg["n_fds"]`` is set).

        Raises:
            TransportClosed: the other end is gone.
        """
        body = json.dumps({**msg, "n_fds": len(fds)}, separators=(",", ":")).encode()
        data = _LEN.pack(len(body)) + body
        try:
            if fds:
                n = socket.send_fds(self.sock, [data], list(fds))
                if n < len(data):
                    self.sock.sendall(data[n:])
            else:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError) as e:
            raise TransportClosed(str(e)) from None

    @overload
    def recv(self, timeout: None = None) -> tuple[dict[str, Any], list[int]]: ...

    @overload
    def recv(self, timeout: float) -> tuple[dict[str, Any], list[int]] | None: ...

    def recv(self, timeout: float | None = None) -> tuple[dict[str, Any], list[int]] | None:
        """The next message and its descriptors; None when ``timeout`` seconds pass first.

        Raises:
            TransportClosed: the other end closed (or died) before a whole message arrived.
            TraceError: a malformed message.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._msgs:
            if deadline is not None:     # (0 or less left: a look at the socket without waiting)
                left = max(0.0, deadline - time.monotonic())
                if not select.select([self.sock], [], [], left)[0]:
                    return None
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, RECV_BYTES, 16)
            except ConnectionResetError as e:
                raise TransportClosed(str(e)) from None
            if not data:
                for fd in fds:
                    os.close(fd)
                raise TransportClosed("the other process closed the control socket")
            self._fds.extend(fds)
            self._buf += data
            self._parse()
        return self._msgs.popleft()

    def poll(self) -> tuple[dict[str, Any], list[int]] | None:
        """A message if one is already waiting, else None (never blocks)."""
        return self.recv(timeout=0.0)

    def ready(self) -> bool:
        """Whether a whole message is waiting (what the socket holds is read, nothing is taken; never blocks).

        Raises:
            TransportClosed / TraceError: as :meth:`recv`.
        """
        if not self._msgs:
            got = self.recv(timeout=0.0)
            if got is None:
                return False
            self._msgs.appendleft(got)
        return True

    def _parse(self) -> None:
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > MAX_MESSAGE:
                raise TraceError("transport message too long", key="length", expected=f"<= {MAX_MESSAGE}", actual=n)
            if len(self._buf) < 4 + n:
                return
            body = bytes(self._buf[4:4 + n])
            del self._buf[:4 + n]
            try:
                msg = json.loads(body)
            except (ValueError, RecursionError) as e:
                raise TraceError(f"transport message is not JSON: {e}", key="message") from None
            if not isinstance(msg, dict):
                raise TraceError("transport message is not an object", key="message", actual=type(msg).__name__)
            k = int(msg.get("n_fds") or 0)
            fds = [self._fds.popleft() for _ in range(min(k, len(self._fds)))]
            self._msgs.append((msg, fds))

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self.sock.close()


# ------------------------------------------------------------------------------------------ rounds
class StopRequested(Exception):
    """The recorder asked the worker to stop (Ctrl-C in the recorder)."""


class RoundSender:
    """Worker side: puts finished rounds into the ring and announces them (see the module docstring).

    With ``threaded``, :meth:`send` only queues the round: a sender thread packs it, copies what
    :meth:`stage` did not place, waits for the recorder to release the round before, and writes the
    message, while the loop (in llama.cpp, without the GIL) goes on. What stays in the loop is
    :meth:`stage`'s copies. Before :meth:`stage` writes into a slot it waits until the round that last
    used the slot was released, so a slot is still never overwritten while the recorder reads it.
    The thread owns the socket while it runs; :meth:`flush` waits until it has sent everything queued
    (call it before another message goes over the channel; :meth:`check_stop` and :meth:`close` do).

    Args:
        chan: the control channel to the recorder. ``release`` messages are counted; a ``stop``
            raises :class:`StopRequested`; other messages are ignored.
        threaded: hand the sending to a thread (the recording worker), else send in the caller.
        prepare: ``prepare(kind, obj)`` -> the object to pack instead, called in the thread that packs (the
            sender thread when threaded) before the message's arrays go into the ring: work on arrays that
            are views of someone else's buffer, done before :meth:`fence` lets that buffer be overwritten
            (the recording worker's reductions of the target's verify rows).
        n_slots: the ring's slots (2 or more): the recorder holds at most ``n_slots - 1`` messages.
        wake_every: more than 1: a doorbell (see the module docstring) rung after this many messages of
            ``batch_kinds`` (at least every :data:`WAKE_AFTER_S`), after any other message, and before waiting
            for a release; give ``n_slots`` >= ``wake_every + 2`` so that the loop does not wait while the
            recorder handles a batch. 1: no doorbell, the recorder wakes for every message.
        batch_kinds: the kinds of message that ring the doorbell only every ``wake_every``.

    Raises:
        ValueError: ``n_slots`` < 2 or ``wake_every`` < 1.
    """

    def __init__(self, chan: Channel, *, threaded: bool = False,
                 prepare: Callable[[str, Any], Any] | None = None, n_slots: int = 2, wake_every: int = 1,
                 batch_kinds: frozenset[str] = frozenset()) -> None:
        if n_slots < 2 or wake_every < 1:
            raise ValueError(f"RoundSender needs n_slots >= 2 and wake_every >= 1, got {n_slots} and {wake_every}")
        self.chan = chan
        self.prepare = prepare
        self.n_slots = int(n_slots)
        self.wake_every = int(wake_every)
        self.batch_kinds = batch_kinds
        #: the doorbell's write end (made with the first ring when wake_every > 1), messages sent since it last
        #: rang, and when it did
        self._bell: int | None = None
        self._unrung = 0
        self._rang_at = time.monotonic()
        self.ring: Ring | None = None
        self.n_sent = 0         # messages written to the channel
        self.n_queued = 0       # messages handed to send() (== n_sent unless threaded)
        self.n_written = 0      # messages whose arrays are all in the ring (see fence())
        self.n_released = 0     # rounds the recorder has released
        self.stopped = False
        #: seconds spent waiting for the recorder to release a round (back-pressure; the sender thread's
        #: waits when threaded, plus the loop's waits for a free slot)
        self.wait_seconds = 0.0
        self._stage_off = 0     # bytes of the next message's slot already filled by stage()
        # id(array) -> (array, offset in the slot, ring); the array is kept alive here until sent
        self._staged: dict[int, tuple[np.ndarray, int, Ring]] = {}
        self._stage_ring: Ring | None = None
        self._old_rings: list[Ring] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        if threaded:
            self._q: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="mtpscope-round-sender", daemon=True)
            self._thread.start()

    # -- the loop's side
    def reserve(self, slot_bytes: int) -> None:
        """Make the ring now (``slot_bytes`` per slot), so that the first round is staged too and no
        round has to grow it. Call before the first :meth:`send`."""
        self.flush()
        if self.ring is None or self.ring.slot_bytes < slot_bytes:
            self._new_ring(int(slot_bytes))

    def stage(self, a: np.ndarray) -> np.ndarray:
        """A copy of ``a`` placed straight into the ring slot the next message will use, so that
        :meth:`send` need not copy it again (``MtpRuntime.run(keep=...)`` for the logits).
        A plain copy when there is no ring yet or the slot is full.

        Raises:
            StopRequested / TransportClosed: (threaded) the sender thread met one.
        """
        return self.stage_with(a, _copy_into)[0]

    def stage_with(self, a: np.ndarray, fill: Callable[[np.ndarray, np.ndarray], T]) -> tuple[np.ndarray, T]:
        """:meth:`stage` with the copy made by ``fill(a, dst)``, which must copy ``a`` into ``dst`` (an empty
        array of ``a``'s shape and dtype) and may compute something in the same read; returns the copy and what
        ``fill`` returned (the recording worker's drafter rows: the copy and their top-k,
        :func:`traces.run.row_kernels.copy_top_k`).

        Raises:
            StopRequested / TransportClosed: (threaded) the sender thread met one.
        """
        if self._stage_off == 0:              # the first array of a message: its slot must be free
            if self._thread is not None:
                self._wait_slot_free(self.n_queued)
            self._stage_ring = self.ring
        ring = self._stage_ring
        size = -(-a.nbytes // _ALIGN) * _ALIGN
        if ring is None or self._stage_off + size > ring.slot_bytes:
            dst = np.empty_like(a)
            return dst, fill(a, dst)
        slot = self.n_queued % self.n_slots
        dst = np.ndarray(a.shape, dtype=a.dtype, buffer=ring.mm, offset=slot * ring.slot_bytes + self._stage_off)
        got = fill(a, dst)
        self._staged[id(dst)] = (dst, self._stage_off, ring)
        self._stage_off += size
        return dst, got

    def send(self, kind: str, obj: Any, **extra: Any) -> None:
        """Send ``obj`` (a dataclass; its arrays through the ring) as a message of ``kind``: now, after
        the recorder has released the previous such message, or (threaded) queued for the sender thread.
        The arrays must not change afterwards.

        Raises:
            StopRequested: the recorder asked to stop (this message is not sent).
            TransportClosed: the recorder is gone.
        """
        job = (kind, obj, extra, self.n_queued % self.n_slots, self._staged, self._stage_off)
        self._staged, self._stage_off, self._stage_ring = {}, 0, None
        if self._thread is None:
            self._send_now(*job)
            self.n_queued = self.n_sent
            return
        self._raise_error()
        self.n_queued += 1
        self._q.put(job)

    def post(self, msg: dict[str, Any]) -> None:
        """Send a message without arrays (the worker's prompt ends, its last words) after everything queued
        (:meth:`flush`), and ring the doorbell: the recorder handles it now.

        Raises:
            TransportClosed: the recorder is gone.
        """
        self.flush()
        self.chan.send(msg)
        self._ring_bell()

    def fence(self) -> None:
        """Return once the arrays of every message handed to :meth:`send` are in the ring (copied by the
        sender thread when threaded), so that arrays that were views of someone else's buffer may be
        overwritten there (``MtpRuntime.run(fence=...)``: the target's logits).

        Raises:
            StopRequested / TransportClosed: (threaded) the sender thread met one.
        """
        if self._thread is None:
            self._raise_error()
            return
        self._wait_for(lambda: self.n_written >= self.n_queued)

    def thread_cpu_seconds(self) -> float:
        """CPU seconds the sender thread has used so far (0 without one, or where the platform cannot
        tell: ``time.pthread_getcpuclockid``)."""
        th = self._thread
        if th is None or th.ident is None or not hasattr(time, "pthread_getcpuclockid"):
            return 0.0
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(th.ident))
        except OSError:
            return 0.0

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the sender thread has sent (or, after an error, dropped) everything queued; False
        when ``timeout`` seconds passed first. Never raises."""
        if self._thread is None:
            return True
        q = self._q
        deadline = None if timeout is None else time.monotonic() + timeout
        with q.all_tasks_done:
            while q.unfinished_tasks:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                q.all_tasks_done.wait(left)
        return True

    def check_stop(self) -> None:
        """Handle waiting messages without blocking (after a :meth:`flush`); raise :class:`StopRequested`
        if asked to stop (or the error the sender thread met)."""
        self.flush()
        self._raise_error()
        self._poll()

    def close(self) -> None:
        """Send what is queued, stop the sender thread, unmap the ring, close the doorbell (which wakes the
        recorder). Idempotent."""
        if self._thread is not None:
            self.flush()
            self._q.put(None)
            self._thread.join()
            self._thread = None
        if self._bell is not None:
            os.close(self._bell)
            self._bell = None
        for r in [*self._old_rings, self.ring]:
            if r is not None:
                r.close()
        self._old_rings.clear()
        self.ring = None

    # -- internals
    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _wait_slot_free(self, n: int) -> None:
        """(threaded) Block until message ``n - n_slots``, the last one in message ``n``'s slot, is released."""
        self._wait_for(lambda: self.n_released >= n - self.n_slots + 1)

    def _wait_for(self, done: Any) -> None:
        """(threaded) Block until ``done()`` holds (the sender thread notifies on every change), counting
        the wait in :attr:`wait_seconds`; raise the sender thread's error instead if it met one."""
        if not done():
            t0 = time.perf_counter()
            with self._cond:
                while not done() and self._error is None:
                    self._cond.wait()
            self.wait_seconds += time.perf_counter() - t0
        self._raise_error()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    try:
                        self._send_now(*job)
                    except BaseException as e:  # noqa: BLE001 - handed to the loop's thread
                        with self._cond:
                            self._error = e
                            self._cond.notify_all()
            finally:
                self._q.task_done()

    def _handle(self, msg: dict[str, Any], fds: list[int]) -> None:
        for fd in fds:
            os.close(fd)
        kind = msg.get("kind")
        if kind == "release":
            with self._cond:
                self.n_released = max(self.n_released, int(msg.get("n", 0)))
                self._cond.notify_all()
        elif kind == "stop":
            self.stopped = True
            raise StopRequested

    def _poll(self) -> None:
        """Handle the messages already waiting (no blocking); :class:`StopRequested` on a stop."""
        if self.stopped:
            raise StopRequested
        while True:
            got = self.chan.poll()
            if got is None:
                return
            self._handle(*got)

    def _ring_bell(self) -> None:
        """Wake the recorder (with a doorbell; a full pipe means it has a wake-up waiting already)."""
        if self._bell is not None:
            try:
                os.write(self._bell, b"\0")
            except (BlockingIOError, BrokenPipeError):
                pass
        self._unrung = 0
        self._rang_at = time.monotonic()

    def _wait_released(self, n: int) -> None:
        if self.n_released >= n:
            return
        if self._unrung:
            self._ring_bell()                        # the recorder may be asleep with our messages unread
        t0 = time.perf_counter()
        try:
            while self.n_released < n:
                got = self.chan.recv()
                self._handle(*got)
        finally:
            self.wait_seconds += time.perf_counter() - t0

    def _new_ring(self, slot_bytes: int) -> Ring:
        """A bigger ring, sent to the recorder; it is :attr:`ring` from now on (returned)."""
        self._wait_released(self.n_sent)             # the recorder is done with every slot
        old = self.ring
        ring = self.ring = Ring.create(max(slot_bytes, 2 * (old.slot_bytes if old else 0), 1 << 20), self.n_slots)
        fds = [ring.fd]
        if self.wake_every > 1 and self._bell is None:     # the doorbell goes with the first ring
            r, w = os.pipe()
            os.set_blocking(w, False)
            fds.append(r)
            self._bell = w
        try:
            self.chan.send({"kind": "ring", "slot_bytes": ring.slot_bytes, "n_slots": ring.n_slots}, fds=fds)
        finally:
            if len(fds) > 1:
                os.close(fds[1])                     # the recorder has its own copy now
        if old is not None:
            # staged arrays may still lie in it (the loop may be staging into it now): unmapped at close()
            self._old_rings.append(old)
        return ring

    def _send_now(self, kind: str, obj: Any, extra: dict[str, Any], slot: int,
                  staged: dict[int, tuple[np.ndarray, int, Ring]], stage_off: int) -> None:
        if self.prepare is not None:
            obj = self.prepare(kind, obj)
        header, arrays = pack(obj)
        specs, need, placed = self._layout(arrays, staged, stage_off)
        ring = self.ring
        if ring is None or need > ring.slot_bytes:
            ring = self._new_ring(need)
            specs, need = Ring.layout(arrays)
            placed = set()
        ring.write(slot, arrays, specs, skip=placed)
        with self._cond:
            self.n_written += 1
            self._cond.notify_all()
        self._poll()
        # at most n_slots - 1 messages unreleased once this one is sent (two slots: every earlier one released)
        self._wait_released(self.n_sent - self.n_slots + 2)
        self.chan.send({"kind": kind, "seq": self.n_sent, "slot": slot, "obj": header,
                        "arrays": [[s.offset, s.dtype, list(s.shape)] for s in specs], **extra})
        self.n_sent += 1
        self._unrung += 1
        if (kind not in self.batch_kinds or self._unrung >= self.wake_every
                or time.monotonic() - self._rang_at >= WAKE_AFTER_S):
            self._ring_bell()

    def _layout(self, arrays: Sequence[np.ndarray], staged: dict[int, tuple[np.ndarray, int, Ring]],
                stage_off: int) -> tuple[list[ArraySpec], int, set[int]]:
        """:meth:`Ring.layout`, keeping staged arrays (of the current ring) where :meth:`stage` put them:
        ``(specs, bytes needed, indices of the arrays already in place)``."""
        if self.ring is None or not staged:
            specs, need = Ring.layout(arrays)
            return specs, need, set()
        specs = []
        placed: set[int] = set()
        end = stage_off
        for i, a in enumerate(arrays):
            got = staged.get(id(a))
            if got is not None and got[0] is a and got[2] is self.ring:
                specs.append(ArraySpec(got[1], a.dtype.str, a.shape))
                placed.add(i)
            else:
                specs.append(ArraySpec(end, a.dtype.str, a.shape))
                end += -(-a.nbytes // _ALIGN) * _ALIGN
        return specs, end, placed


class RoundReceiver:
    """Recorder side: turns ``ring`` / round messages back into objects (:meth:`unpack`), releases them, and
    waits for the next message (:meth:`wait`: on the doorbell when the sender gave one).

    Args:
        chan: the control channel to the worker.
        defer_release: :meth:`release` only counts; :meth:`flush_releases` (which :meth:`wait` calls before it
            sleeps) tells the worker, one message for all. False: one message per release.
    """

    def __init__(self, chan: Channel, *, defer_release: bool = False) -> None:
        self.chan = chan
        self.ring: Ring | None = None
        self.n_released = 0
        self.defer_release = defer_release
        self._told = 0          # releases the worker has been told of
        #: the doorbell's read end (from the first ring message of a sender with ``wake_every`` > 1), or None
        self.bell: int | None = None

    def on_ring(self, msg: dict[str, Any], fds: list[int]) -> None:
        """Map the ring a ``ring`` message carries (replacing the previous one); keep the doorbell that may
        come with it.

        Raises:
            TraceError: no memory descriptor, or more than the ring's and the doorbell's.
        """
        if len(fds) not in (1, 2):
            for fd in fds:
                os.close(fd)
            raise TraceError("ring message without its memory descriptor", key="n_fds", expected="1 or 2",
                             actual=len(fds))
        if self.ring is not None:
            self.ring.close()
        self.ring = Ring(fds[0], int(msg["slot_bytes"]), int(msg.get("n_slots", 2)))
        if len(fds) == 2:
            if self.bell is not None:
                os.close(self.bell)
            self.bell = fds[1]

    def wait(self, timeout: float) -> tuple[dict[str, Any], list[int]] | None:
        """The next message: one already here, else (after :meth:`flush_releases`) the first to come within
        ``timeout`` seconds, else None. With a doorbell, sleeps on it rather than on the socket, then takes what
        the socket holds; a closed doorbell (the worker exited or died) is dropped and the socket waited on.

        Raises:
            TransportClosed: the worker closed the socket (it exited or died) and nothing is left to read.
            TraceError: a malformed message.
        """
        got = self.chan.poll()
        if got is not None:
            return got
        self.flush_releases()
        if self.bell is None:
            return self.chan.recv(timeout=timeout)
        # (a read of nothing: the write end closed, no more rings; the socket tells the rest)
        if select.select([self.bell], [], [], timeout)[0] and not os.read(self.bell, 4096):
            os.close(self.bell)
            self.bell = None
            return self.chan.recv(timeout=timeout)
        return self.chan.poll()

    def unpack(self, msg: dict[str, Any]) -> Any:
        """The object of a round message; arrays of ``COPY_BELOW`` bytes or more are views into the
        ring, valid until :meth:`release`.

        Raises:
            TraceError: no ring yet, or a malformed message.
        """
        if self.ring is None:
            raise TraceError("round message before any ring", key="ring")
        try:
            specs = [ArraySpec(int(o), str(d), tuple(int(x) for x in sh)) for o, d, sh in msg["arrays"]]
            arrays = self.ring.read(int(msg["slot"]), specs)
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"malformed round message: {e}", key="arrays") from None
        return unpack(msg["obj"], arrays)

    def release(self) -> None:
        """The oldest unreleased round's slot may be reused (call after analysing it; rounds are released in the
        order they came): the worker is told now, or with ``defer_release`` at the next :meth:`flush_releases`.

        Raises:
            TransportClosed: the worker is gone.
        """
        self.n_released += 1
        if not self.defer_release:
            self.flush_releases()

    def flush_releases(self) -> None:
        """Tell the worker of the releases it has not heard of (one message).

        Raises:
            TransportClosed: the worker is gone.
        """
        if self.n_released > self._told:
            self._told = self.n_released
            self.chan.send({"kind": "release", "n": self.n_released})

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.bell is not None:
            os.close(self.bell)
            self.bell = None


__all__ = ["COPY_BELOW", "ArraySpec", "Channel", "Ring", "RoundReceiver", "RoundSender", "StopRequested",
           "TransportClosed"]
