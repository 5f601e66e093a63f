"""The hpc bench's large rows side by side at each thread level: mpicomm's ratio, and the level's own cost."""

from __future__ import annotations

from mpicomm.apps.bench.hpc import level_rows


def _job(ours: float, raw: float) -> dict[str, object]:
    return {"rows": {f"all_reduce {m} MiB": {"mpicomm": ours * m, "mpi4py": raw * m} for m in (4, 8, 16)}}


def test_each_level_shows_mpicomm_over_raw_and_raw_over_singles_raw() -> None:
    jobs = {"mpicomm": _job(1.1, 1.0), "multiple": _job(2.4, 2.0), "single": _job(0.5, 0.5)}
    lines = level_rows(jobs)
    assert len(lines) == 3 and lines[0].split()[:3] == ["all_reduce", "4", "MiB"]
    assert "mpicomm 1.100x (raw 2.000x)" in lines[0]
    assert "multiple 1.200x (raw 4.000x)" in lines[1]
    assert "single 1.000x (raw 1.000x)" in lines[2]


def test_no_line_without_singles_row() -> None:
    assert level_rows({"mpicomm": _job(1.0, 1.0), "single": {"rows": {}}}) == []
