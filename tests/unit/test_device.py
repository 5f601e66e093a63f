"""Binding ranks to GPUs without a GPU: launcher variables, CUDA_VISIBLE_DEVICES, the device choice."""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator

import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.gpu import device
from mpicomm.gpu.device import (
    LOCAL_RANK_VARS,
    bind_device,
    env_local_rank,
    physical_device,
    select_device,
    visible_devices,
)

UUID_A = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
UUID_B = "GPU-1c3b5e5f-0000-4a4a-9b9b-0123456789ab"
MIG = "MIG-3b8c2a4e-5d6f-5a7b-8c9d-0e1f2a3b4c5d"
MIG_OLD = "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0"


@pytest.fixture(autouse=True)
def no_launcher_or_gpu_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (*LOCAL_RANK_VARS, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    device.reset_local_rank()
    yield
    device.reset_local_rank()


@pytest.fixture
def no_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError


class FakeCupy(types.ModuleType):
    """Just enough of cupy's API for bind_device: a device count and Device(i).use()."""

    def __init__(self, count: int | Exception) -> None:
        super().__init__("cupy")
        self.used: list[int] = []
        fake = self

        class Device:
            def __init__(self, index: int) -> None:
                self.index = index

            def use(self) -> None:
                fake.used.append(self.index)

        def get_device_count() -> int:
            if isinstance(count, Exception):
                raise count
            return count

        runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
        self.cuda = types.SimpleNamespace(Device=Device, runtime=runtime)


# ---- launcher variables -------------------------------------------------------------------------------


def test_launcher_variables_are_trusted_before_slurm_localid() -> None:
    assert LOCAL_RANK_VARS == ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
    env = {"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}
    assert env_local_rank(env) == ("OMPI_COMM_WORLD_LOCAL_RANK", 3)
    del env["OMPI_COMM_WORLD_LOCAL_RANK"]
    assert env_local_rank(env) == ("MPI_LOCALRANKID", 2)
    del env["MPI_LOCALRANKID"]
    assert env_local_rank(env) == ("SLURM_LOCALID", 0)
    assert env_local_rank({}) is None


def test_empty_launcher_variable_is_skipped() -> None:
    assert env_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "", "SLURM_LOCALID": " 5 "}) == ("SLURM_LOCALID", 5)


@pytest.mark.parametrize("value", ["-1", "x", "1.0", "0x1"])
def test_bad_launcher_variable_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(ArgumentError) as info:
        env_local_rank({"MPI_LOCALRANKID": value})
    assert "MPI_LOCALRANKID" in str(info.value) and repr(value) in str(info.value)


def test_local_rank_of_a_single_process_is_zero() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device.local_rank() == 0


def test_local_rank_warns_when_the_launcher_disagrees_and_uses_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    with pytest.warns(
        RuntimeWarning, match="OMPI_COMM_WORLD_LOCAL_RANK=3 but this process is node-local rank 0"
    ):
        assert device.local_rank() == 0


def test_local_rank_is_kept_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    assert device.local_rank() == 0
    monkeypatch.setenv("SLURM_LOCALID", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert device.local_rank() == 0  # kept: MPI is not asked again, so nothing to compare
    device.reset_local_rank()
    with pytest.warns(RuntimeWarning, match="SLURM_LOCALID=1"):
        device.local_rank()


# ---- CUDA_VISIBLE_DEVICES -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "visible"),
    [
        (None, None),
        ("", []),
        ("0", ["0"]),
        ("2,0,1", ["2", "0", "1"]),
        (" 1 , 3 ", ["1", "3"]),
        ("0,1,-1,2", ["0", "1"]),  # CUDA stops at the first invalid entry
        ("-1", []),
        ("0,,1", ["0"]),
        ("NoDevFiles", []),  # what Slurm sets when a task has no GPU
        (f"{UUID_A},{UUID_B}", [UUID_A, UUID_B]),
        (f"{UUID_B},0", [UUID_B, "0"]),
        ("GPU-8932f937", ["GPU-8932f937"]),  # a shortened UUID
        (MIG, [MIG]),
        (MIG_OLD, [MIG_OLD]),
        (f"{MIG},bogus,{UUID_A}", [MIG]),
        ("GPU-", []),
    ],
)
def test_visible_devices_follows_cuda_parsing(value: str | None, visible: list[str] | None) -> None:
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible_devices(env) == visible


def test_physical_device_maps_an_index_to_its_visible_entry() -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"3,{UUID_A}"}
    assert [physical_device(i, env) for i in range(2)] == ["3", UUID_A]
    assert physical_device(5, env) == "5" and physical_device(1, {}) == "1"


# ---- the choice ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 8])
def test_select_device_shares_devices_round_robin(count: int) -> None:
    picks = [select_device(r, count) for r in range(3 * count + 1)]
    assert picks == [r % count for r in range(3 * count + 1)]
    assert set(picks) == set(range(count))


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((-1, 2), ArgumentError, "local_rank is -1; expected 0 or more"),
        ((0, 0), ArgumentError, "device_count is 0; expected 1 or more"),
        ((1.0, 2), ArgumentTypeError, "local_rank is a float"),
        ((0, True), ArgumentTypeError, "device_count is a bool"),
    ],
)
def test_select_device_checks_its_arguments(
    args: tuple[object, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        select_device(*args)  # type: ignore[arg-type]
    assert str(info.value).startswith("select_device: ") and words in str(info.value)


def test_bind_device_cpu_does_nothing() -> None:
    assert bind_device("cpu") is None
    assert bind_device("cpu", local_rank=3, device_count=0) is None


@pytest.mark.usefixtures("no_cupy")
def test_bind_device_without_cupy_counts_cuda_visible_devices() -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{UUID_A},{UUID_B},5"}
    assert [bind_device(local_rank=r, env=env) for r in range(5)] == [0, 1, 2, 0, 1]


@pytest.mark.usefixtures("no_cupy")
def test_bind_device_given_count_wins() -> None:
    assert bind_device(local_rank=5, device_count=4, env={"CUDA_VISIBLE_DEVICES": "0"}) == 1


@pytest.mark.usefixtures("no_cupy")
def test_bind_device_without_cupy_or_visible_list_cannot_count() -> None:
    with pytest.raises(ArgumentError, match="cupy is not installed and CUDA_VISIBLE_DEVICES is unset"):
        bind_device(local_rank=0, env={})


@pytest.mark.usefixtures("no_cupy")
@pytest.mark.parametrize(
    ("env", "shown"), [({"CUDA_VISIBLE_DEVICES": ""}, "''"), ({"CUDA_VISIBLE_DEVICES": "-1"}, "'-1'")]
)
def test_bind_device_with_no_visible_device_is_an_error(env: dict[str, str], shown: str) -> None:
    with pytest.raises(ArgumentError) as info:
        bind_device("cuda", local_rank=0, env=env)
    msg = str(info.value)
    assert msg.startswith("bind_device: device is 'cuda' but no CUDA device is visible")
    assert f"CUDA_VISIBLE_DEVICES is {shown}" in msg


@pytest.mark.usefixtures("no_cupy")
def test_bind_device_with_zero_given_devices_is_an_error() -> None:
    with pytest.raises(ArgumentError, match="no CUDA device is visible"):
        bind_device("cuda", local_rank=0, device_count=0, env={})


@pytest.mark.usefixtures("no_cupy")
def test_bind_device_asks_mpi_for_the_local_rank() -> None:
    assert bind_device(device_count=3, env={}) == device.local_rank() % 3


def test_bind_device_with_cupy_sets_the_chosen_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCupy(3)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert bind_device(local_rank=4, env={"CUDA_VISIBLE_DEVICES": "0"}) == 1  # cupy's count wins over the env
    assert fake.used == [1]


def test_bind_device_with_cupy_but_no_driver_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCupy(RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected"))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(ArgumentError, match=r"cannot count devices .*cudaErrorNoDevice"):
        bind_device(local_rank=0, env={})
    assert fake.used == []


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"device": "gpu"}, ArgumentError, "device is 'gpu'; expected 'cuda' or 'cpu'"),
        ({"device": "cuda:0"}, ArgumentError, "device is 'cuda:0'"),
        ({"device": 0}, ArgumentTypeError, "device is a int"),
        ({"local_rank": -2}, ArgumentError, "local_rank is -2"),
        ({"local_rank": "0"}, ArgumentTypeError, "local_rank is a str"),
        ({"device_count": -1}, ArgumentError, "device_count is -1; expected 0 or more"),
    ],
)
def test_bind_device_checks_its_arguments(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        bind_device(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith("bind_device: ") and words in str(info.value)


def test_bind_device_with_cupy_and_every_device_hidden_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(RuntimeError("cudaErrorNoDevice")))
    with pytest.raises(ArgumentError, match="no CUDA device is visible \\(CUDA_VISIBLE_DEVICES is ''\\)"):
        bind_device(local_rank=0, env={"CUDA_VISIBLE_DEVICES": ""})
