"""`make test-cluster`: Tidal runs as one SLURM job across a cluster of containers.

A controller and three compute nodes (tests/cluster/cluster.py) on one Docker network, the
run folder on a folder every node mounts at /shared. From the controller, `tidal rl @
configs/examples/cluster-cpu.toml` renders and `sbatch`es the job: trainer ranks 0 and 1
on node1 and node2 (one torchrun agent each, FSDP2 over gloo between the two
containers, rank 0 serving gRPC beside weightsync and the orchestrator), both inference
replicas on node3, mutual TLS with certificates the job makes for the node hostnames.
Each run must end COMPLETED (`sacct --completion`, which reads the job-completion log:
the cluster has no accounting database) with every RL step trained exactly once and the
reward rising; the first publishes weights through the shared folder, the second through
the broadcast transport across nodes. Apart from the runs, FSDP2 across node1 and node2
must train exactly like one process on the same batch (tests/distributed/test_fsdp.py's
worker and tolerance).

Marked `cluster`: `make test` leaves it out; the Docker engine is installed and started
as for `make test-deploy` (tests/deploy/engine.py). The image stays as the build
cache; the containers and the network are removed; the work folder
(outputs/test-cluster) is removed when every case passed and kept for reading otherwise.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cryptography import x509

from tests.cluster.cluster import COMPUTE, CONTROLLER, ROOT, Cluster, build_image, span_medians
from tests.deploy.engine import ensure_engine, sh
from tests.distributed.test_fsdp import TOL
from tidal.orchestrator.records.run_log import run_log_records, run_log_steps

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]
CONFIG = "configs/examples/cluster-cpu.toml"
RUNS = "/shared/runs"
JOB_TIMEOUT_S = 900
WINDOW = 5
LEARNING_BAR = 0.3  # as the compose stack's and the local default run's tests
TRAINED = re.compile(r"tidal\.trainer\.runner: trained step (\d+)\b")
TIMINGS: dict[str, float] = {}
SPANS = ("rl_step", "trainer.step", "trainer.publish", "inference.load_weights")
"""Spans whose medians each run prints (docs/benchmarks/cluster.md)."""


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    work = ROOT / "outputs" / "test-cluster"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "test-cluster.log"
    print(f"\ntest-cluster: log {log}", flush=True)
    started = time.monotonic()
    print(f"test-cluster: engine: {ensure_engine(log)}", flush=True)
    build_image(work, log)
    TIMINGS["engine+images"] = time.monotonic() - started
    nodes = Cluster(work, log)
    t = time.monotonic()
    try:
        nodes.start()
        TIMINGS["bring-up"] = time.monotonic() - t
        yield nodes
    finally:
        nodes.remove()
        if request.session.testsfailed == 0:
            shutil.rmtree(work)
        phases = ", ".join(f"{k} {v:.0f}s" for k, v in TIMINGS.items())
        print(f"\ntest-cluster: wall time {time.monotonic() - started:.0f}s ({phases})")


def _assert_completed(
    cluster: Cluster, job: str, run_dir: Path, ended_before: tuple[str, ...] = ()
) -> None:
    """Waits for the job in scontrol (the live state), then asserts through `sacct
    --completion` that it ended in the states `ended_before` (each followed by a requeue)
    and then COMPLETED 0:0, every time on the three nodes."""
    fields = cluster.wait_job(job, JOB_TIMEOUT_S)
    records = cluster.completions(job, count=len(ended_before) + 1)
    print(f"test-cluster: {run_dir.name}: sacct --completion -j {job}: {records}", flush=True)
    expected = [
        {"JobID": job, "State": state, "ExitCode": "0:0", "NodeList": "node[1-3]"}
        for state in (*ended_before, "COMPLETED")
    ]
    if records != expected:
        logs = sorted((run_dir / "logs").glob("*"))
        detail = "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in logs)
        raise AssertionError(f"job {job}: {records}\n{fields}\n{detail}\n{cluster.logs()}")


def _run(cluster: Cluster, name: str, *overrides: str) -> Path:
    """Submit the example as run `name` and wait for its job to complete; the run dir."""
    t = time.monotonic()
    job = cluster.submit("@", CONFIG, "--run.output-dir", RUNS, "--run.name", name, *overrides)
    run_dir = cluster.shared / "runs" / name
    _assert_completed(cluster, job, run_dir)
    TIMINGS[f"run {name}"] = time.monotonic() - t
    medians = ", ".join(f"{k} {v:.4f}s" for k, v in span_medians(run_dir, SPANS).items())
    print(f"test-cluster: {name}: job {TIMINGS[f'run {name}']:.0f}s; medians {medians}")
    return run_dir


def _check_learned(run_dir: Path, steps: int) -> None:
    """Every step in metrics.jsonl and trained exactly once; the reward rose."""
    assert run_log_steps(run_dir / "metrics.jsonl") == list(range(1, steps + 1))
    trained = [int(s) for s in TRAINED.findall((run_dir / "logs" / "trainer.log").read_text())]
    assert trained == list(range(1, steps + 1)), trained
    records = run_log_records(run_dir / "metrics.jsonl")
    rl = [r["reward_mean"] for r in records if r["phase"] == "rl"]
    first, last = sum(rl[:WINDOW]) / WINDOW, sum(rl[-WINDOW:]) / WINDOW
    print(f"test-cluster: {run_dir.name}: reward {first:.3f} -> {last:.3f}", flush=True)
    assert last - first >= LEARNING_BAR, f"reward {first:.3f} -> {last:.3f}"


def _steps() -> int:
    config = tomllib.loads((ROOT / CONFIG).read_text())["orchestrator"]
    return int(config["warmup_steps"] + config["steps"])


def test_job_trains_across_nodes_with_weights_on_the_shared_folder(cluster: Cluster) -> None:
    run_dir = _run(cluster, "fs")
    _check_learned(run_dir, _steps())
    trainer_log = (run_dir / "logs" / "trainer.log").read_text()
    assert "rank 1 of 2 follows rank 0" in trainer_log, trainer_log[-3000:]
    assert "serving on node1:50053" in trainer_log
    replica_log = (run_dir / "logs" / "inference-1.log").read_text()
    assert "serving on node3:50055 as inference-1" in replica_log
    # mutual TLS between the nodes, with the certificates the job made for their hostnames
    (tls,) = run_dir.glob("tls-job-*")
    certificate = x509.load_pem_x509_certificate((tls / "trainer.pem").read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(COMPUTE) <= set(names.get_values_for_type(x509.DNSName))


def test_job_trains_across_nodes_with_broadcast_weights(cluster: Cluster) -> None:
    run_dir = _run(
        cluster,
        "broadcast",
        "--weightsync.transport.type", "broadcast",
        "--weightsync.transport.replicas", "2",
    )  # fmt: skip
    _check_learned(run_dir, _steps())
    logs = "\n".join(p.read_text() for p in (run_dir / "logs").glob("inference-*.log"))
    assert "by broadcast" in logs, logs[-3000:]
    # The reference: bare gloo broadcasts of one version's bytes over the same three ranks
    # (rank 0 on node1, the two replica ranks on node3).
    size = sum(p.stat().st_size for p in (run_dir / "weights").glob("v*/model.safetensors"))
    count = len(list((run_dir / "weights").glob("v*/model.safetensors")))
    shutil.copy(ROOT / "tests" / "cluster" / "gloo_broadcast.py", cluster.shared)
    script = (
        f"n=1; [ $SLURM_NODEID = 1 ] && n=2; OMP_NUM_THREADS=1 python -m torch.distributed.run "
        f"--nnodes=2 --nproc-per-node=$n --node-rank=$SLURM_NODEID --master-addr={COMPUTE[0]} "
        f"--master-port=29601 /shared/gloo_broadcast.py --bytes {size // count} --repeats 20"
    )
    done = cluster.exec(
        CONTROLLER, "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        f"--nodelist={COMPUTE[0]},{COMPUTE[2]}", "bash", "-c", script, timeout=600,
    )  # fmt: skip
    reference = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"test-cluster: bare gloo broadcast node1 -> node3 (3 ranks): {reference}")


def test_fsdp_across_two_nodes_equals_one_process(cluster: Cluster) -> None:
    """tests/distributed/workers/fsdp_step.py: FSDP2 with one rank on node1 and one on
    node2 (srun, torchrun static rendezvous on node1), and meanwhile the single-process
    reference on node3."""
    worker = "/shared/fsdp_step.py"
    shutil.copy(ROOT / "tests" / "distributed" / "workers" / "fsdp_step.py", cluster.shared)
    out = "/shared/fsdp"
    cluster.exec(CONTROLLER, "mkdir", "-p", out)
    single = subprocess.Popen(
        ["docker", "exec", cluster.name(CONTROLLER), "srun", "--nodes=1",
         f"--nodelist={COMPUTE[2]}", "env", "OMP_NUM_THREADS=1", "python", worker,
         "--modes", "single", "--out", f"{out}/ref.pt"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    torchrun = (
        "OMP_NUM_THREADS=1 python -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
        f'--node-rank="$SLURM_NODEID" --master-addr={COMPUTE[0]} --master-port=29600 '
        f"{worker} --modes fsdp --out {out}/sharded.pt"
    )
    cluster.exec(
        CONTROLLER, "srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
        f"--nodelist={COMPUTE[0]},{COMPUTE[1]}", "bash", "-c", torchrun, timeout=600,
    )  # fmt: skip
    output, _ = single.communicate(timeout=600)
    assert single.returncode == 0, output[-3000:]
    reference = torch.load(cluster.shared / "fsdp" / "ref.pt")["single"]
    sharded = torch.load(cluster.shared / "fsdp" / "sharded.pt")["fsdp"]
    for kind in ("grads", "params"):
        assert sharded[kind].keys() == reference[kind].keys()
        for name, expected in reference[kind].items():
            torch.testing.assert_close(
                sharded[kind][name], expected, atol=TOL, rtol=0, msg=f"{kind} {name}"
            )


# Run on node3: SIGKILL the replica's service process (not its job_service supervisor).
CRASH_REPLICA = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\\0")
    if argv[1:3] == [b"-m", b"tidal.inference"] and b"inference-1" in argv:
        os.kill(int(pid), signal.SIGKILL)
        print(pid)
"""
RESUMED = re.compile(r"resumed from \S+ \(step (\d+)\)")
REPLAYED = re.compile(r"tidal\.trainer\.runner: replayed step (\d+) from the step journal")


def _surviving_lineage(trainer_log: str) -> list[int]:
    """The steps of the trainer lineage that survived (tests/integration/test_fault_suite)."""
    lineage: list[int] = []
    for line in trainer_log.splitlines():
        if m := RESUMED.search(line):
            lineage = [s for s in lineage if s <= int(m.group(1))]
        elif m := TRAINED.search(line) or REPLAYED.search(line):
            lineage.append(int(m.group(1)))
    return lineage


def _wait(what: str, predicate, timeout_s: float, every_s: float = 1.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every_s)


def test_a_crashed_replica_is_restarted_and_a_lost_node_requeues_and_resumes(
    cluster: Cluster,
) -> None:
    """Mid-run, SIGKILL inference-1's process on node3: its job_service restarts it. Then
    kill node2's container (trainer rank 1): the job is requeued, runs again once node2
    is back, and continues from checkpoint + journal with every step trained once."""
    name = "faults"
    steps = _steps()
    run_dir = cluster.shared / "runs" / name
    job = cluster.submit(
        "@", CONFIG, "--run.output-dir", RUNS, "--run.name", name,
        "--trainer.ckpt.interval", "10",
    )  # fmt: skip

    def done_steps() -> int:
        return len(run_log_steps(run_dir / "metrics.jsonl"))

    _wait("step 20 of the faults run", lambda: done_steps() >= 20, JOB_TIMEOUT_S)
    killed = cluster.exec(COMPUTE[2], "python", "-c", CRASH_REPLICA).stdout.split()
    assert killed, "no inference-1 process on node3"
    record = run_dir / "supervision-inference-1.json"
    _wait(
        "inference-1 restarted by its job_service",
        lambda: record.is_file() and json.loads(record.read_text())["restarts"]["inference-1"] == 1,
        120,
    )
    at = done_steps()
    _wait("two more steps", lambda: done_steps() >= at + 2, 300)
    lost_at = done_steps()
    assert lost_at < steps, "the run ended before the node was lost"
    sh(["docker", "kill", cluster.name(COMPUTE[1])], log=cluster.log)
    print(f"test-cluster: killed node2 at step {lost_at}/{steps}", flush=True)
    _wait(
        "the job requeued",
        lambda: cluster.job(job).get("Restarts", "0") != "0",
        180,
    )
    sh(["docker", "start", cluster.name(COMPUTE[1])], log=cluster.log)
    # two records: NODE_FAIL when node2 was lost (then the requeue), then COMPLETED
    _assert_completed(cluster, job, run_dir, ended_before=("NODE_FAIL",))
    lineage = _surviving_lineage((run_dir / "logs" / "trainer.log").read_text())
    assert lineage == list(range(1, steps + 1)), lineage
    assert run_log_steps(run_dir / "metrics.jsonl") == list(range(1, steps + 1))
