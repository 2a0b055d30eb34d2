"""`orch logs --rank N` of an elastic PyTorchJob picks the pod torchrun gave node rank N (issue #19 point 13).

The emulator plays the training operator (Worker pods NAME-worker-I, no Master for an elastic job) and the
c10d rendezvous of torch's elastic agents, which numbers the nodes by their sorted addresses, each agent's
FQDN starting with its pod's hostname (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:
`for rank, node in enumerate(sorted(state.participants))`): each pod logs the rank it got.
"""

from __future__ import annotations

from tests.fakes.emulator import JOBS

NODES = 12
NS = "team-a"  # the env fixture's current namespace


def c10d_ranks(job: str, nodes: int) -> dict[str, int]:
    """pod -> the node rank the c10d rendezvous gives it."""
    return {pod: rank for rank, pod in enumerate(sorted(f"{job}-worker-{i}" for i in range(nodes)))}


def test_logs_rank_follows_c10d_not_the_pod_index(env, tmp_path):
    job_file = tmp_path / "big.yaml"
    job_file.write_text(
        f"name: demo\nimage: registry.example/trainer:1\nnodes: {NODES}\n"
        "train: {task: digits, batch_size: 96, max_steps: 10}\n"
    )
    assert env.orch("submit", str(job_file)).exit_code == 0
    assert set(env.kube.get(JOBS, NS, "demo")["spec"]["pytorchReplicaSpecs"]) == {"Worker"}  # elastic
    ranks = c10d_ranks("demo", NODES)
    for i in range(NODES):
        pod = env.kube.add_pod(NS, "demo", "worker", i)
        env.kube.write_log(NS, pod, f"group_rank={ranks[pod]}")
    assert ranks["demo-worker-10"] == 2 and ranks["demo-worker-2"] == 4
    for rank in (0, 2, 4, 11):
        shown = env.orch("logs", "demo", "--rank", str(rank)).stdout.splitlines()
        (line,) = shown
        assert line.endswith(f"group_rank={rank}"), (rank, shown)
    assert env.orch("logs", "demo", "--rank", "2").stdout.splitlines() == ["[worker-10] group_rank=2"]
