"""torch's own distributed test suite (``DistributedTest._DistTestBase``) against mpicomm, with torch's
Gloo as the reference in the same harness, at 2 and 3 ranks (``make test-torch``).

* backend label ``gloo``: every in-scope test that passes on torch's Gloo passes on mpicomm, unless
  ``scope.KNOWN_DIFFERENCES`` lists it with its reason;
* backend label ``mpi`` (the tests torch runs for its own MPI backend; torch's wheel has no MPI
  backend to compare with): every in-scope test that runs passes, with the same exceptions;
* torch.distributed itself on the registered backend (``import mpicomm.torch``, ``BACKEND=mpicomm``):
  no in-scope test fails.

Each run writes its table to ``build/torchsuite/<impl>-<label>-<ranks>.txt``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")

from torchsuite import scope, suite

REPORTS = Path(__file__).resolve().parents[2] / "build" / "torchsuite"


def _in_scope() -> list[str]:
    return [n for n in suite.all_tests() if scope.out_of_scope(n) is None]


def _report(name: str, results: dict[str, suite.Outcome]) -> str:
    REPORTS.mkdir(parents=True, exist_ok=True)
    lines = [f"{status:5} {test} {detail}".rstrip() for test, (status, detail) in sorted(results.items())]
    (REPORTS / f"{name}.txt").write_text("\n".join(lines) + "\n")
    counts = {s: sum(1 for st, _ in results.values() if st == s) for s in ("pass", "fail", "hang", "skip")}
    return ", ".join(f"{v} {k}" for k, v in counts.items())


def _unexpected(
    results: dict[str, suite.Outcome], label: str, ranks: int, names: list[str]
) -> dict[str, str]:
    bad = {}
    for name in names:
        status, detail = results.get(name, ("not run", ""))
        if status in ("pass", "skip") or name in scope.KNOWN_DIFFERENCES:
            continue
        if scope.not_meaningful_here(name, suite.source_of(name), label, ranks) is None:
            bad[name] = f"{status}: {detail}"
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_every_test_that_passes_on_gloo_passes_on_mpicomm(ranks: int) -> None:
    names = _in_scope()
    reference = suite.run("torch", "gloo", ranks, names)
    ours = suite.run("mpicomm", "gloo", ranks, [n for n in names if n not in scope.KNOWN_HANGS])
    summary = f"torch gloo: {_report(f'torch-gloo-{ranks}', reference)}"
    summary += f"; mpicomm: {_report(f'mpicomm-gloo-{ranks}', ours)}"
    passing = [n for n in names if reference.get(n, ("", ""))[0] == "pass"]
    assert len(passing) >= 60, (
        f"the reference passes only {len(passing)} tests: the harness is broken ({summary})"
    )
    bad = _unexpected(ours, "gloo", ranks, passing)
    assert not bad, f"{len(bad)} tests pass on torch gloo and not on mpicomm ({summary}):\n" + "\n".join(
        f"  {n}: {why}" for n, why in bad.items()
    )


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_the_mpi_label_tests_pass_on_mpicomm(ranks: int) -> None:
    names = [n for n in _in_scope() if n not in scope.KNOWN_HANGS]
    ours = suite.run("mpicomm", "mpi", ranks, names)
    summary = _report(f"mpicomm-mpi-{ranks}", ours)
    bad = _unexpected(ours, "mpi", ranks, names)
    assert not bad, f"{len(bad)} tests fail on mpicomm under the mpi label ({summary}):\n" + "\n".join(
        f"  {n}: {why}" for n, why in bad.items()
    )


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 3])
def test_the_suite_passes_on_the_registered_backend(ranks: int) -> None:
    """torch.distributed itself with ``BACKEND=mpicomm`` (``import mpicomm.torch``): no test fails.

    torch gates many tests on the backend's name (gloo-only or MPI-only features, NCCL batches); an
    unknown name such as ``mpicomm`` skips those, and the table in build/torchsuite lists the reasons.
    """
    names = [n for n in _in_scope() if n not in scope.KNOWN_HANGS]
    ours = suite.run("backend", "mpicomm", ranks, names)
    summary = _report(f"backend-mpicomm-{ranks}", ours)
    passing = [n for n, (status, _) in ours.items() if status == "pass"]
    assert len(passing) >= 45, f"only {len(passing)} tests pass: the harness is broken ({summary})"
    bad = {n: f"{status}: {detail}" for n, (status, detail) in ours.items() if status not in ("pass", "skip")}
    assert not bad, f"{len(bad)} tests fail on the registered backend ({summary}):\n" + "\n".join(
        f"  {n}: {why}" for n, why in bad.items()
    )


def test_every_known_difference_and_scope_rule_names_a_reason() -> None:
    names = set(suite.all_tests())
    assert set(scope.KNOWN_DIFFERENCES) <= names, "a known difference names a test torch no longer has"
    assert all(len(why) > 20 for why in scope.KNOWN_DIFFERENCES.values())
    assert all(len(why) > 10 for _, why in scope.OUT_OF_SCOPE)
