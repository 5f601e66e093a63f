"""The direct path over real MPI, on device-array stand-ins whose memory is host memory (issue 24, 5(b)).

MPICH is not CUDA-aware, so it carries these host pointers correctly; ``MPICOMM_CUDA_AWARE=1`` forces
the direct path, so the pointers, layouts and MPI calls that path hands to MPI are checked for real.
The fake cupy (tests/fakecupy) runs the real ``CupyBackend``; the lazy stand-in (tests/standin.py)
checks that the path asks nothing of cupy beyond the backend protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm import ArgumentError, CommunicationError
from mpicomm.front import device as front
from mpicomm.gpu import backend as gpu_backend
from mpicomm.gpu import cuda_aware, staged

# validation mode never takes the direct path (mpicomm/gpu/direct.py): these tests force it
pytestmark = pytest.mark.usefixtures("validation_off")


@pytest.fixture
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    testing.use_staged(monkeypatch, aware="1")
    assert cuda_aware.cuda_awareness().path == "direct"
    yield fake
    fake._fake.drain()
    cuda_aware.reset_cuda_awareness()


def test_data_movement_takes_the_direct_path_and_matches_numpy(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 3 * n)
    b = cp.zeros(3 * n)
    cp._fake.later(b, x[r])  # still queued on the caller's stream: the direct path must wait for it
    mpicomm.broadcast(b, src=n - 1)
    np.testing.assert_array_equal(b.get(), x[n - 1])
    out = cp.zeros(n * 3 * n)
    mpicomm.all_gather_into_tensor(out, cp.asarray(x[r]))
    np.testing.assert_array_equal(out.get(), x.reshape(-1))
    a2a = cp.zeros(3 * n)
    mpicomm.all_to_all_single(a2a, cp.asarray(x[r]))
    np.testing.assert_array_equal(a2a.get(), x[:, 3 * r : 3 * r + 3].reshape(-1))
    for fn in ("broadcast", "all_gather_into_tensor", "all_to_all_single"):
        assert front.PATHS[fn, "direct"] == 1, fn


def test_the_in_place_all_gather_idiom_is_passed_as_mpi_in_place(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 5)
    out = cp.full(5 * n, -1.0)
    mine = out[5 * r : 5 * (r + 1)]
    cp._fake.later(mine, x[r])
    mpicomm.all_gather_into_tensor(out, mine)
    np.testing.assert_array_equal(out.get(), x.reshape(-1))
    assert front.PATHS["all_gather_into_tensor", "direct"] == 1


def test_all_to_all_single_with_its_input_as_output_is_refused_like_the_host(cp: Any) -> None:
    _, n = world()
    buf = cp.zeros(2 * n)
    with pytest.raises(ArgumentError, match="all_to_all_single: input overlaps output"):
        mpicomm.all_to_all_single(buf, buf)
    host = np.zeros(2 * n)
    with pytest.raises(ArgumentError, match="all_to_all_single: input overlaps output"):
        mpicomm.all_to_all_single(host, host)


def test_a_short_receive_into_a_strided_array_keeps_the_rest(cp: Any) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    x = inputs(n, 3)
    base = cp.full(16, -1.0)
    got = base[::2]  # strided: received through a contiguous copy
    if r % 2 == 0 and r + 1 < n:
        mpicomm.send(cp.asarray(x[r]), dst=r + 1)
    elif r % 2 == 1:
        assert mpicomm.recv(got, src=r - 1) == r - 1
        want = np.full(16, -1.0)
        want[0:6:2] = x[r - 1]
        np.testing.assert_array_equal(base.get(), want)
        assert front.PATHS["recv", "direct"] == 1


def test_an_mpi_error_on_the_direct_path_is_a_communication_error(cp: Any) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    if r % 2 == 0 and r + 1 < n:
        mpicomm.send(cp.asarray(np.arange(10.0)), dst=r + 1)
    elif r % 2 == 1:
        with pytest.raises(CommunicationError, match="recv"):
            mpicomm.recv(cp.zeros(4), src=r - 1)  # a longer message: truncated


def test_the_direct_path_asks_only_the_backend_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lazy stand-in has no ``cp``: the strided output's temporary comes from the protocol."""
    from standin import DeviceArray, LazyBackend

    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    cuda_aware.reset_cuda_awareness()
    fake = LazyBackend()
    old = gpu_backend.set_backend(fake)
    staged.reset_pool()
    try:
        r, n = world()
        x = inputs(n, 4)
        host = np.full(8, -1.0)
        strided = DeviceArray(host[::2])
        if r == 0:
            strided.a[...] = x[0]
        mpicomm.broadcast(strided, src=0)
        fake.current.synchronize()
        np.testing.assert_array_equal(host[::2], x[0])
        np.testing.assert_array_equal(host[1::2], -1.0)
    finally:
        gpu_backend.set_backend(old)
        staged.reset_pool()
        cuda_aware.reset_cuda_awareness()
