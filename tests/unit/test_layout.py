"""Rank layouts (block and cyclic, GPUs, CPUs, node names) and check_environment with explicit environments.

The environments are the ones Slurm 22.05 gives tasks (shared/reference/slurm-on-one-machine.md):
``srun -N2 --ntasks-per-node=4`` direct launch, and ``mpiexec`` inside a batch job, where every rank sees
the launcher proxy's SLURM_PROCID=0 and its rank comes from PMI.
"""

from __future__ import annotations

import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError, MpicommError
from mpicomm.planner import (
    JobShape,
    LayoutMismatchError,
    RankLayout,
    RankPlacement,
    Topology,
    check_environment,
)
from mpicomm.planner.environment import job_rank_and_size


def layout(distribution: str = "block", names: str | None = "n[1-2]", **kw: int) -> RankLayout:
    shape = JobShape(nodes=2, ntasks_per_node=4, distribution=distribution, **kw)
    return RankLayout.from_shape(shape, names)


def reference_placement(rank: int, nodes: int, tasks: int, distribution: str) -> tuple[int, int]:
    """(node index, local rank) by counting: Slurm deals ranks out in blocks or one node at a time."""
    order = [(n, t) for n in range(nodes) for t in range(tasks)]  # block: fill node 0 first
    if distribution == "cyclic":
        order = [(n, t) for t in range(tasks) for n in range(nodes)]
    return order[rank]


@pytest.mark.parametrize("distribution", ["block", "cyclic"])
@pytest.mark.parametrize(("nodes", "tasks"), [(1, 1), (2, 4), (3, 2), (4, 3)])
def test_layout_matches_slurms_distribution(distribution: str, nodes: int, tasks: int) -> None:
    shape = JobShape(nodes=nodes, ntasks_per_node=tasks, distribution=distribution)
    lay = RankLayout.from_shape(shape)
    assert lay.world_size == nodes * tasks == shape.world_size
    for p in lay.ranks:
        assert (p.node_index, p.local_rank) == reference_placement(p.rank, nodes, tasks, distribution)
        assert p.node_name == f"node{p.node_index}"
    for n in range(nodes):
        assert [p.local_rank for p in lay.on_node(n)] == list(range(tasks))


def test_block_layout_example() -> None:
    lay = layout(gpus_per_node=4, cpus_per_task=2)
    assert lay.ranks[5] == RankPlacement(
        rank=5, node_index=1, node_name="n2", local_rank=1, gpu=1, cpus=(2, 3)
    )
    assert [p.node_name for p in lay.ranks] == ["n1"] * 4 + ["n2"] * 4
    assert lay.tasks_per_node == [4, 4] and lay.named


def test_cyclic_layout_alternates_nodes() -> None:
    lay = layout("cyclic")
    assert [(p.node_name, p.local_rank) for p in lay.ranks[:4]] == [
        ("n1", 0),
        ("n2", 0),
        ("n1", 1),
        ("n2", 1),
    ]


def test_fewer_gpus_than_tasks_share_round_robin_and_no_gpus_is_none() -> None:
    assert [p.gpu for p in layout(gpus_per_node=2).ranks[:4]] == [0, 1, 0, 1]
    assert all(p.gpu is None for p in layout().ranks)


def test_node_names_as_list_or_default() -> None:
    assert RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=1), ["a", "b"]).node_names == ("a", "b")
    lay = RankLayout.from_shape(JobShape(nodes=2))
    assert lay.node_names == ("node0", "node1") and not lay.named


def test_layout_round_trips_through_a_dict() -> None:
    for lay in (layout("cyclic", gpus_per_node=2), layout(names=None)):
        assert RankLayout.from_dict(lay.to_dict()) == lay


def test_shape_from_topology() -> None:
    assert JobShape.from_topology(Topology(8, local_world_size=4)) == JobShape(2, 4, 4, 1, "block")
    assert JobShape.from_topology(Topology(8, compute_device="cpu")).gpus_per_node == 0


@pytest.mark.parametrize(
    ("make", "exc", "words"),
    [
        (lambda: JobShape(nodes=0), ArgumentError, "JobShape: nodes is 0; expected at least 1"),
        (
            lambda: JobShape(ntasks_per_node=1.5),  # type: ignore[arg-type]
            ArgumentTypeError,
            "ntasks_per_node is float",
        ),
        (lambda: JobShape(gpus_per_node=-1), ArgumentError, "gpus_per_node is -1; expected at least 0"),
        (lambda: JobShape(distribution="plane"), ArgumentError, "distribution is 'plane'"),
        (
            lambda: RankLayout.from_shape(JobShape(nodes=2), "n[1-3]"),
            ArgumentError,
            "node_names has 3 names; expected 2",
        ),
        (lambda: RankLayout.from_shape(JobShape(nodes=2), ["a", "a"]), ArgumentError, "repeats a name"),
        (
            lambda: RankLayout.from_shape((2, 4)),  # type: ignore[arg-type]
            ArgumentTypeError,
            "shape is tuple; expected a JobShape",
        ),
    ],
)
def test_bad_shapes_and_names(make, exc, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc) as info:
        make()
    assert words in str(info.value)


def srun_env(rank: int, lay: RankLayout, **extra: str) -> dict[str, str]:
    """What srun -N2 --ntasks-per-node=4 gives task ``rank`` (direct launch, pmi2)."""
    p = lay.ranks[rank]
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(p.local_rank),
        "SLURM_NODEID": str(p.node_index),
        "SLURM_NODELIST": "n[1-2]",
        "SLURMD_NODENAME": p.node_name,
        "SLURM_NTASKS": "8",
        "SLURM_NTASKS_PER_NODE": "4",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "PMI_RANK": str(rank),
        "PMI_SIZE": "8",
    }
    env.update(extra)
    return env


@pytest.mark.parametrize("distribution", ["block", "cyclic"])
def test_srun_direct_launch_matches_on_every_rank(distribution: str) -> None:
    lay = layout(distribution)
    for r in range(8):
        assert check_environment(lay, srun_env(r, lay)) == lay.ranks[r]


def test_mpiexec_inside_sbatch_takes_the_rank_from_pmi_not_slurm_procid() -> None:
    lay = layout()
    for r in range(8):
        p = lay.ranks[r]
        env = {  # the launcher proxy's step: one task per node, so SLURM_* describe the proxy
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": str(p.node_index),
            "SLURM_NTASKS": "2",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_NODELIST": "n[1-2]",
            "SLURMD_NODENAME": p.node_name,
            "PMI_RANK": str(r),
            "PMI_SIZE": "8",
            "MPI_LOCALRANKID": str(p.local_rank),
        }
        assert check_environment(lay, env).rank == r
        assert check_environment(lay, {**env, "PMI_RANK": "0"}, rank=r) == p  # the argument wins


def test_open_mpi_variables() -> None:
    lay = layout()
    env = {"OMPI_COMM_WORLD_RANK": "6", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "2"}
    assert check_environment(lay, env).rank == 6
    # mpirun numbers a node's processes in its own order (Open MPI 5 gave 0, 2, 1 to world ranks 0, 1, 2
    # on one node): any local rank within the node's task count is accepted, one outside is not
    assert check_environment(lay, {**env, "OMPI_COMM_WORLD_LOCAL_RANK": "1"}).rank == 6
    with pytest.raises(
        LayoutMismatchError, match=r"rank 6 has local rank 4 .*OMPI_COMM_WORLD_LOCAL_RANK.*one of 0..3"
    ):
        check_environment(lay, {**env, "OMPI_COMM_WORLD_LOCAL_RANK": "4"})


def test_srun_local_id_must_match_exactly() -> None:
    lay = layout()
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2", "SLURM_NODEID": "1"}
    assert check_environment(lay, env).rank == 6
    with pytest.raises(LayoutMismatchError, match=r"rank 6 has local rank 1 \(from SLURM_LOCALID\)"):
        check_environment(lay, {**env, "SLURM_LOCALID": "1"})


def test_wrong_rank_count_says_planned_and_running() -> None:
    with pytest.raises(LayoutMismatchError) as info:
        check_environment(layout(), {"PMI_RANK": "1", "PMI_SIZE": "6"})
    assert "planned for 8 ranks, running on 6 (from PMI_SIZE)" in str(info.value)
    assert isinstance(info.value, MpicommError) and isinstance(info.value, RuntimeError)
    with pytest.raises(
        LayoutMismatchError, match="planned for 8 ranks, running on 4 \\(from the world_size argument"
    ):
        check_environment(layout(), {}, rank=0, world_size=4)
    with pytest.raises(LayoutMismatchError, match="running on 1 \\(from no launcher variable"):
        check_environment(layout(), {})


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"SLURM_NODELIST": "n[1-3]"}, "planned for 2 node(s), running on 3 (n[1-3])"),
        ({"SLURM_NODELIST": "m[1-2]"}, "the job's nodes are ['m1', 'm2'] (SLURM_NODELIST)"),
        (
            {"SLURMD_NODENAME": "n1"},
            "rank 5 has the node 'n1' (from SLURMD_NODENAME); the layout expects 'n2'",
        ),
        ({"SLURM_LOCALID": "3"}, "rank 5 has local rank 3 (from SLURM_LOCALID)"),
        ({"SLURM_NODEID": "0"}, "rank 5 has node index 0 (from SLURM_NODEID)"),
        ({"SLURM_TASKS_PER_NODE": "5,3"}, "runs 5,3 tasks per node"),
        ({"SLURM_NTASKS_PER_NODE": "2"}, "tasks per node 2 (from SLURM_NTASKS_PER_NODE)"),
        ({"PMI_RANK": "x"}, "PMI_RANK is 'x'; expected an integer"),
    ],
)
def test_mismatches_are_named(change: dict[str, str], words: str) -> None:
    lay = layout()
    with pytest.raises(LayoutMismatchError) as info:
        check_environment(lay, srun_env(5, lay, **change))
    assert words in str(info.value) and str(info.value).startswith("check_environment: ")


def test_unnamed_layout_skips_name_checks_but_counts_nodes() -> None:
    lay = layout(names=None)
    assert (
        check_environment(lay, srun_env(5, lay, SLURMD_NODENAME="whatever", SLURM_NODELIST="c[7-8]")).rank
        == 5
    )
    with pytest.raises(LayoutMismatchError, match="planned for 2 node"):
        check_environment(lay, srun_env(5, lay, SLURM_NODELIST="c7"))


def test_bad_arguments() -> None:
    with pytest.raises(ArgumentTypeError, match="layout is JobShape; expected a RankLayout"):
        check_environment(JobShape(), {})  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match="rank is str"):
        check_environment(layout(), {}, rank="1")  # type: ignore[arg-type]
    with pytest.raises(LayoutMismatchError, match=r"rank is 9 .* expected 0 <= rank < 8"):
        check_environment(layout(), {}, rank=9, world_size=8)


def test_job_rank_and_size_prefers_the_launcher() -> None:
    assert job_rank_and_size(
        {"PMI_RANK": "3", "PMI_SIZE": "8", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    ) == (3, 8)
    assert job_rank_and_size({"SLURM_PROCID": "2", "SLURM_NTASKS": "4"}) == (2, 4)
    assert job_rank_and_size({}) == (0, 1)
