"""How the object collectives move bytes: chunked messages, v-collectives with a large-size fallback.

Every message is cut into pieces of at most :data:`CHUNK` bytes, so objects and payloads over 2 GiB
work on MPI libraries without MPI-4 large counts (Open MPI 5.0) as well as on those with them. The
v-collectives (``Allgatherv``, ``Gatherv``, ``Scatterv``) take ``int`` displacements there, so a
call whose receive buffer would pass 2 GiB moves each rank's part with chunked broadcasts or
point-to-point messages instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _mpi
from ..core.buffers import displacements
from ..core.control import PAYLOAD_ENV, allgather_texts, decode, memory_bound
from .devbufs import spec, split_words
from .pickling import KINDS, ObjectCollectiveError

if TYPE_CHECKING:
    from ..core.groups import ProcessGroup

__all__ = [
    "CHUNK",
    "agree",
    "allgatherv",
    "as_bytes",
    "bcast_bytes",
    "gatherv",
    "recv_envelope",
    "scatterv",
    "send_envelope",
]

#: The largest single MPI message the object collectives send, in bytes.
CHUNK = 1 << 30
#: Counts and displacements of the v-collectives must stay below this many bytes.
INT_MAX = 2**31 - 1
#: Tag of the object collectives' point-to-point messages on a group's internal communicator.
TAG = 20290
U8 = np.uint8
I8 = np.int64
#: Bytes of the first message of a broadcast: the header (sizes) and, when they fit, the pickles.
ENVELOPE = 8192


def as_bytes(data: Any) -> np.ndarray:
    """A flat uint8 view of a bytes-like object or array, without copying."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(U8)
    return np.frombuffer(data, U8)


#: Receive buffers of at least this many bytes are touched page by page before MPI writes into them.
PREFAULT_MIN = 1 << 20
#: Bytes between two touches: one per 4 KiB page (a huge page takes its first touch only).
PAGE = 4096


def receive_buffer(size: int, fn: str = "an object collective", sender: int | None = None) -> np.ndarray:
    """A new uint8 buffer of ``size`` bytes to receive into, its pages already mapped.

    Fresh memory is mapped on first touch. Left to MPI, that happens inside the library's pipelined
    copy, one page fault at a time while the sender waits: a first 2.2 GiB broadcast at 2 ranks ran at
    0.3 GB/s, a second one (into memory mapped before) at 2.2 GB/s. One write per page first costs
    far less than the stalls.

    Raises:
        ObjectCollectiveError: the memory cannot be had (``size`` is a peer's claim, within the
            payload cap but past what this process may allocate); names ``sender`` (a group rank;
            None: the ranks together) and the size.
    """
    try:
        out = np.empty(size, U8)
        if size >= PREFAULT_MIN:
            out[::PAGE] = 0
    except MemoryError:
        who = "the ranks together" if sender is None else f"group rank {sender}"
        raise ObjectCollectiveError(
            f"{fn}: {who} sent a claim of {size} bytes, which this rank could not allocate (MemoryError); "
            f"expected a payload that fits in memory (the cap {PAYLOAD_ENV} allows {memory_bound()} bytes: "
            "lower it on every rank to refuse such claims before allocating)"
        ) from None
    return out


def pieces(buf: Any) -> list[Any]:
    """``buf`` (flat bytes, host or device) cut into messages of at most CHUNK bytes."""
    return [buf[i : i + CHUNK] for i in range(0, buf.size, CHUNK)]


def bcast_bytes(comm: Any, buf: Any, root: int) -> None:
    """Broadcast a flat uint8 buffer (host or device) of a size every rank knows, in pieces <= CHUNK bytes."""
    for piece in pieces(buf):
        comm.Bcast(spec(piece), root)


def send_bytes(comm: Any, buf: Any, dst: int, tag: int = TAG) -> None:
    """Send a flat uint8 buffer (host or device) in pieces (the receiver knows its size)."""
    for piece in pieces(buf):
        comm.Send(spec(piece), dst, tag)


def recv_bytes(comm: Any, buf: Any, src: int, tag: int = TAG) -> None:
    """Receive what :func:`send_bytes` sent into ``buf`` (host or device)."""
    for piece in pieces(buf):
        comm.Recv(spec(piece), src, tag)


def send_envelope(comm: Any, header: np.ndarray, stream: np.ndarray, root: int) -> None:
    """The source's side: header and stream, the first ENVELOPE bytes in one message."""
    hb = header.view(U8)
    env = np.empty(ENVELOPE, U8)
    k = min(hb.size, ENVELOPE)
    env[:k] = hb[:k]
    inline = min(stream.size, ENVELOPE - k) if hb.size <= ENVELOPE else 0
    env[k : k + inline] = stream[:inline]
    comm.Bcast([env, _mpi.MPI.BYTE], root)
    if hb.size > ENVELOPE:
        bcast_bytes(comm, hb[ENVELOPE:], root)
    if stream.size > inline:
        bcast_bytes(comm, stream[inline:], root)


def recv_envelope(comm: Any, root: int, fn: str = "broadcast_object_list") -> tuple[np.ndarray, np.ndarray]:
    """A receiver's side of :func:`send_envelope`: the header words and the stream.

    Raises:
        ObjectCollectiveError: the header claims sizes no real object has (see :func:`check_header`).
    """
    env = np.empty(ENVELOPE, U8)
    comm.Bcast([env, _mpi.MPI.BYTE], root)
    words = env[:32].view(I8)
    check_counts(fn, [int(words[1]), int(words[3])], [int(words[2])], root)
    _, n, slen, nbufs = (int(v) for v in words)
    hlen = 8 * (4 + n + nbufs)
    if hlen <= ENVELOPE:
        header = env[:hlen].view(I8)
        inline = min(slen, ENVELOPE - hlen)
    else:
        hb = np.empty(hlen, U8)
        hb[:ENVELOPE] = env
        bcast_bytes(comm, hb[ENVELOPE:], root)
        header, inline = hb.view(I8), 0
    check_header(fn, header, root)
    if slen <= inline:
        return header, env[hlen : hlen + slen]
    stream = receive_buffer(slen, fn, root)
    stream[:inline] = env[hlen : hlen + inline]
    bcast_bytes(comm, stream[inline:], root)
    return header, stream


def check_counts(fn: str, counts: Sequence[int], sizes: Sequence[int], sender: int | None) -> None:
    """Refuse negative counts and sizes, or sizes past the payload cap, before anything is allocated.

    ``counts`` are numbers of items (objects, buffers), ``sizes`` byte counts, as claimed by the
    group rank ``sender`` (``None``: by the ranks together).

    Raises:
        ObjectCollectiveError: a claim no real message makes.
    """
    bound = memory_bound()
    if any(c < 0 or 8 * c > bound for c in counts) or any(s < 0 for s in sizes) or sum(sizes) > bound:
        raise ObjectCollectiveError(
            f"{fn}: {'the ranks together' if sender is None else f'group rank {sender}'} claim(s) counts "
            f"{list(counts)} and sizes {list(sizes)} (bytes); expected "
            f"non-negative sizes of at most {bound} bytes in all (the cap {PAYLOAD_ENV} sets; by default a "
            "quarter of this node's memory): a rank that does not speak mpicomm's wire format, a "
            f"corrupted message, or a payload larger than the cap (raise {PAYLOAD_ENV} on every rank)"
        )


def check_header(fn: str, header: np.ndarray, sender: int) -> None:
    """Check a whole object header (kind, n, stream bytes, buffer count, n sizes, buffer words).

    A buffer word is ``2 * bytes + device flag`` (:func:`~mpicomm.objects.devbufs.word`).
    """
    n, slen = int(header[1]), int(header[2])
    words = header[4:].tolist()
    sizes, bufs = words[:n], words[n:]
    check_counts(fn, [n, int(header[3])], [slen, *sizes, *(split_words(bufs)[0] if bufs else ())], sender)
    if header[0] == 0 and sum(sizes) != slen:
        raise ObjectCollectiveError(
            f"{fn}: group rank {sender} claims objects of {sizes[:n]} bytes; expected them to sum to {slen}, "
            "the stream's size (a corrupted message)"
        )


def allgatherv(g: ProcessGroup, send: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """Every rank's ``send`` (``counts[r]`` bytes from rank r), concatenated in rank order."""
    displs = displacements(counts)
    out = receive_buffer(sum(counts), "all_gather_object")
    if out.size <= INT_MAX:
        byte = _mpi.MPI.BYTE
        g.comm.Allgatherv([send, byte], [out, (list(counts), displs), byte])
        return out
    out[displs[g.rank()] : displs[g.rank()] + send.size] = send
    for r, (start, count) in enumerate(zip(displs, counts, strict=True)):
        bcast_bytes(g.comm, out[start : start + count], r)
    return out


def gatherv(g: ProcessGroup, send: np.ndarray, counts: Sequence[int], root: int) -> np.ndarray | None:
    """Every rank's ``send`` concatenated on ``root`` (None elsewhere)."""
    displs = displacements(counts)
    total = sum(counts)
    byte = _mpi.MPI.BYTE
    if total <= INT_MAX:
        out = receive_buffer(total) if g.rank() == root else None
        recv = [out, (list(counts), displs), byte] if out is not None else None
        g.comm.Gatherv([send, byte], recv, root)
        return out
    if g.rank() != root:
        send_bytes(g.internal, send, root)
        return None
    out = receive_buffer(total)
    for r, (start, count) in enumerate(zip(displs, counts, strict=True)):
        part = out[start : start + count]
        if r == root:
            part[:] = send
        else:
            recv_bytes(g.internal, part, r)
    return out


def scatterv(
    g: ProcessGroup, parts: list[np.ndarray] | None, count: int, total: int, root: int
) -> np.ndarray:
    """Rank r receives ``parts[r]`` (given on ``root``) into a new buffer of ``count`` bytes.

    ``total`` is the sum of all parts, known to every rank.
    """
    out = receive_buffer(count)
    byte = _mpi.MPI.BYTE
    if total <= INT_MAX:
        if parts is None:
            g.comm.Scatterv(None, [out, byte], root)
        else:
            counts = [p.size for p in parts]
            joined = np.concatenate(parts)
            g.comm.Scatterv([joined, (counts, displacements(counts)), byte], [out, byte], root)
    elif parts is None:
        recv_bytes(g.internal, out, root)
    else:
        for r, part in enumerate(parts):
            if r == root:
                out[:] = part
            else:
                send_bytes(g.internal, part, r)
    return out


def agree(g: ProcessGroup, kind: int, message: str) -> None:
    """Raise on every rank if any rank failed: the lowest failing rank's error, the same everywhere.

    Costs one 8-byte ``Allreduce`` when every rank succeeded.

    Args:
        g: The group of the call.
        kind: 0 if this rank succeeded, else the error class's code in ``pickling.KINDS``.
        message: This rank's error message (ignored when ``kind`` is 0).
    """
    flag = np.array([kind], np.int64)
    g.comm.Allreduce(_mpi.MPI.IN_PLACE, flag, _mpi.MPI.MAX)
    if flag[0]:
        raise_reports(g, kind, message)


def raise_reports(g: ProcessGroup, kind: int, message: str) -> None:
    """Gather every rank's ``(kind, message)`` as int64 words and bytes (no pickle) and raise the first."""
    reports = allgather_texts(g.comm, kind, message.encode(), side=g.internal)
    raise_first([(k, decode(m)) for k, m in reports])


def raise_first(reports: Sequence[tuple[int, str]]) -> None:
    """Raise the first failure among per-rank ``(kind, message)`` reports, if any.

    A code outside :data:`~mpicomm.objects.pickling.KINDS` (sent by a rank that does not speak
    mpicomm's wire format) raises :class:`ObjectCollectiveError`.
    """
    failed = [(k, m) for k, m in reports if k]
    if failed:
        kind, message = failed[0]
        if len(failed) > 1:
            message += f" (and {len(failed) - 1} more rank(s) failed)"
        cls = KINDS[kind] if 0 < kind < len(KINDS) else None
        if cls is None:
            raise ObjectCollectiveError(
                f"a rank sent the unknown error code {kind} with the message {message!r}"
            )
        raise cls(message)
