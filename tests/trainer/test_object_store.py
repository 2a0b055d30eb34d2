"""Checkpoints and outputs on an object store, against a real S3-compatible server on 127.0.0.1 (moto's
server mode, tests/s3server.py): write, rotate, resume (also at another world size through `orch run`), a
2-rank async save hashed by each rank, a kill during a save, a store that throttles (503 SlowDown) and one
that dies mid-run, a missing bucket and bad credentials at start, the run's results (model.pt, TensorBoard's
events, summary.json) refused, throttled or cut off at its end. Nothing is mocked: HTTP requests to a real server, a real gloo group.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchestrator import exit_codes, storage
from orchestrator.trainer import checkpoint
from tests.fakes.cli import run_orch
from tests.s3server import Failing, Throttling, s3_server
from tests.trainer.test_checkpoint import (
    TRAIN_STATE,
    each_rank_hashes_only_what_it_wrote,
    full_state,
    trained,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def s3(monkeypatch):
    with s3_server() as server:
        server.create_bucket("bkt")
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        yield server


@pytest.fixture
def group(tmp_path_factory):
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def saver(url: str, keep: int = 2, **kwargs) -> checkpoint.Checkpointer:
    return checkpoint.Checkpointer(
        storage.location(url), every_steps=10, keep=keep, rank=0, world_size=1, **kwargs
    )


def names(url: str) -> list[str]:
    root = storage.location(url)
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_checkpoints_write_rotate_verify_and_resume_on_an_s3_store(s3, group):
    url = "s3://bkt/run/checkpoints"
    module, optimizer = trained()
    store = saver(url)
    for step in (10, 20, 30):
        store.save(step, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    assert names(url) == ["step-00000020", "step-00000030"]  # rotation deleted step 10's objects
    newest = storage.location(url) / "step-00000030"
    assert sorted(p.name for p in newest.iterdir()) == [
        ".metadata", "__0_0.distcp", "orch-checkpoint.json", "train.pt"
    ]  # fmt: skip
    assert checkpoint.verify(newest) is None
    other, other_optimizer = trained(seed=1)
    resumed = saver(url).load(module=other, optimizer=other_optimizer)
    assert resumed.step == 30 and str(resumed.path) == f"{url}/step-00000030"
    assert resumed.state["counters"] == TRAIN_STATE["counters"]
    expected, got = full_state(module), full_state(other)
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    # model.pt: one PUT, loadable by torch.load from the object's bytes
    checkpoint.write_atomic(storage.location("s3://bkt/run/model.pt"), checkpoint.full_model_state(module))
    import io

    plain = torch.load(io.BytesIO(storage.location("s3://bkt/run/model.pt").read_bytes()), weights_only=True)
    assert all(torch.equal(plain[k], expected[k]) for k in expected)


def test_async_saves_land_complete_on_an_s3_store(s3, group):
    url = "s3://bkt/async/checkpoints"
    module, optimizer = trained()
    store = saver(url, async_save=True)
    store.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    store.close()  # waits for the write and writes the marker
    assert checkpoint.verify(storage.location(url) / "step-00000010") is None


def test_a_2_rank_async_save_is_hashed_by_each_rank_through_the_store(s3, tmp_path):
    """Each rank downloads only what it wrote; their digests meet in the store (.orch-digests/RANK.json)."""
    each_rank_hashes_only_what_it_wrote("s3://bkt/ranks/checkpoints", tmp_path, async_save=True)


def test_a_marker_less_prefix_is_not_a_checkpoint_and_the_next_start_removes_it(s3, group):
    url = "s3://bkt/partial/checkpoints"
    module, optimizer = trained()
    saver(url).save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    partial = storage.location(url) / "step-00000020"
    (partial / "__0_0.distcp").write_bytes(b"half a shard")  # what a kill before the marker leaves
    assert checkpoint.verify(partial) == "no orch-checkpoint.json (an incomplete write)"
    assert checkpoint.newest_valid(storage.location(url))[0] == storage.location(url) / "step-00000010"
    resumed = saver(url).load(module=module, optimizer=optimizer)
    assert resumed.step == 10 and names(url) == ["step-00000010"]


KILL_SCRIPT = """
import sys, torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
from torch import nn
from orchestrator import storage
from orchestrator.trainer import checkpoint
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
store = checkpoint.Checkpointer(storage.location({url!r}), every_steps=10, keep=5, rank=0, world_size=1)
small = nn.Linear(4, 4)
store.save(10, module=small, optimizer=torch.optim.SGD(small.parameters(), lr=0.1), train_state={{}})
print("first done", flush=True)
big = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(12)])  # ~200 MB: the write takes a while
store.save(20, module=big, optimizer=torch.optim.SGD(big.parameters(), lr=0.1), train_state={{}})
print("second done", flush=True)
"""


def test_a_kill_during_an_s3_save_leaves_the_previous_checkpoint_loadable(s3, tmp_path):
    """kill -9 mid-upload, then a resume: the partial step-20 prefix (no marker) is never loaded, and removed.
    #33: while the first run writes, a second run on the prefix is refused in one line naming it, and its
    start does not remove the first's write in flight as a leftover; the lease the kill left behind is taken
    over at once (its process is gone)."""
    url = "s3://bkt/kill/checkpoints"
    script = KILL_SCRIPT.format(repo=str(REPO_ROOT), store=str(tmp_path / "store"), url=url)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "first done"
    partial = storage.location(url) / "step-00000020"
    deadline = time.monotonic() + 180
    while not (partial.exists() and any(True for _ in partial.iterdir())):  # the first object of step 20
        assert time.monotonic() < deadline and process.poll() is None, "the write never started"
        time.sleep(0.01)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store2", rank=0, world_size=1)
    try:
        with pytest.raises(checkpoint.CheckpointError) as caught:
            saver(url)  # a second run, while the first writes
        host = storage.holder_identity()["host"]
        assert str(caught.value) == (
            f"checkpoint directory {url} is in use by another run (host {host}, pid {process.pid}; its lease "
            "s3://bkt/kill/.checkpoints.orch-lock renewed within the last 30 s): one run at a time; wait for it "
            "to finish, or give this run its own prefix (--out, output.url or train.checkpoint.dir)"
        )
        assert any(True for _ in partial.iterdir())  # the first run's write in flight was left alone
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert not (partial / checkpoint.MARKER).exists(), "the write finished before the kill"
        assert checkpoint.newest_valid(storage.location(url))[0] == storage.location(url) / "step-00000010"
        assert storage.location("s3://bkt/kill/.checkpoints.orch-lock").exists()  # what kill -9 leaves
        small = nn.Linear(4, 4)
        resumed = saver(url).load(module=small, optimizer=torch.optim.SGD(small.parameters(), lr=0.1))
        assert resumed.step == 10 and names(url) == ["step-00000010"]  # the leftover was removed
    finally:
        dist.destroy_process_group()


def test_a_throttling_store_is_retried_with_backoff(s3, group, monkeypatch):
    with Throttling(s3.endpoint, every=3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        url = "s3://bkt/throttled/checkpoints"
        module, optimizer = trained()
        store = saver(url)
        for step in (10, 20, 30):
            store.save(step, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
        other, other_optimizer = trained(seed=1)
        assert saver(url).load(module=other, optimizer=other_optimizer).step == 30
        assert names(url) == ["step-00000020", "step-00000030"]
    assert proxy.throttled >= 10, proxy.throttled  # every third request was a 503 SlowDown, and retried


def test_a_store_that_dies_mid_run_fails_the_save_in_one_line(s3, group, monkeypatch):
    monkeypatch.setenv(storage.RETRY_SECONDS, "2")
    url = "s3://bkt/dies/checkpoints"
    module, optimizer = trained()
    store = saver(url)
    store.save(10, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    s3.kill()
    started = time.monotonic()
    with pytest.raises(checkpoint.CheckpointError) as caught:
        store.save(20, module=module, optimizer=optimizer, train_state=TRAIN_STATE)
    assert time.monotonic() - started < 60  # the retry budget, not a hang
    assert str(caught.value) == (
        f"checkpoint at step 20: could not write {url}: the store at {s3.endpoint} (AWS_ENDPOINT_URL) cannot be "
        "reached (connection refused); check the store (its credentials, its endpoint, that it is up) and "
        "run again: training resumes from the last complete checkpoint"
    )


# --- the run's results at its end (#33) ------------------------------------------------------------------------

SUMMARY = {"steps": 20, "final_loss": 0.5}


def results_to_keep(tmp_path: Path) -> tuple[Path, dict]:
    """What rank 0 has at the end: TensorBoard's events in the output directory, the final weights."""
    (tmp_path / "out" / "tensorboard").mkdir(parents=True)
    (tmp_path / "out" / "tensorboard" / "events.out.tfevents.1").write_bytes(b"events")
    return tmp_path / "out", {"weight": torch.ones(4, 4)}


@pytest.mark.parametrize(
    ("how", "name", "reason"),
    [
        ("refused", "model.pt", "access denied (the credentials may not write there)"),
        ("throttled", "tensorboard", "the store kept throttling (503 SlowDown) past the retry budget"),
        ("gone", "summary.json", "the store at {endpoint} (AWS_ENDPOINT_URL) cannot be reached (the connection failed)"),
    ],
)  # fmt: skip
def test_results_the_store_will_not_take_are_one_line_and_no_summary_claims_them(
    s3, monkeypatch, tmp_path, how, name, reason
):
    """#33: a failed upload at the end was a traceback (`rank 0 failed (exit code 1): }` through `orch run`), and
    summary.json went up before TensorBoard's events. Now: one line naming what, where (the endpoint) and why;
    summary.json last, and the one an earlier run left on the prefix removed first, so that no summary stands
    beside results that are not there (or not its own)."""
    from orchestrator.trainer import results

    earlier = storage.location("s3://bkt/run")
    (earlier / "summary.json").write_bytes(b'{"steps": 10}')  # an earlier run's, on the prefix resumed
    output_dir, model = results_to_keep(tmp_path)
    (output_dir / "summary.json").write_text('{"steps": 10}')  # ... and in the output directory
    monkeypatch.setenv(storage.RETRY_SECONDS, "2")
    with Failing(s3.endpoint, (name,), how) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(results.ResultsNotKept) as caught:
            results.keep(output_dir, dict(SUMMARY), model=model, store=storage.location("s3://bkt/run"),
                         tensorboard="tensorboard")  # fmt: skip
    what = {"model.pt": "model.pt", "tensorboard": "TensorBoard's events (tensorboard/)"}.get(name, name)
    where = (
        "s3://bkt/run" if how == "gone" else f"s3://bkt/run (the store at {proxy.endpoint}, AWS_ENDPOINT_URL)"
    )
    unclaimed = "" if name == "summary.json" else "no summary.json was written; "
    assert str(caught.value) == (
        f"training finished at step 20, but {what} could not be written to {where}: "
        f"{reason.format(endpoint=proxy.endpoint)}; {unclaimed}check the store (its credentials, its endpoint, that "
        "it is up) and run again with the same output: it resumes from its last checkpoint and writes the results"
    )
    assert proxy.failed >= 1 and "testing" not in str(caught.value)  # (the secret key is "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    kept = names("s3://bkt/run")
    assert "summary.json" not in kept and not (output_dir / "summary.json").exists()
    assert ("model.pt" in kept) == (name != "model.pt")  # written up to the write that failed, none after
    assert ("tensorboard" in kept) == (name == "summary.json")
    assert (output_dir / "model.pt").exists()  # the local copy, which the rerun uploads again


def test_results_in_the_store_end_with_summary_json(s3, tmp_path):
    from orchestrator.trainer import results

    output_dir, model = results_to_keep(tmp_path)
    results.keep(output_dir, dict(SUMMARY), model=model, store=storage.location("s3://bkt/run"),
                 tensorboard="tensorboard")  # fmt: skip
    assert names("s3://bkt/run") == ["model.pt", "summary.json", "tensorboard"]
    assert json.loads((storage.location("s3://bkt/run") / "summary.json").read_text()) == SUMMARY
    assert json.loads((output_dir / "summary.json").read_text()) == SUMMARY


def test_a_missing_bucket_or_bad_credentials_is_one_line_at_start(s3, monkeypatch):
    with pytest.raises(storage.StorageError) as caught:
        storage.check_writable("s3://no-such-bucket/run")
    assert str(caught.value) == "cannot write to s3://no-such-bucket/run: the bucket does not exist"
    # The AWS SDKs' S3-only endpoint variable is honoured as they honour it (object_store reads only the other):
    # without it, these requests went to AWS
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
    storage.check_writable("s3://bkt/run")
    (storage.location("s3://bkt/run") / "f").write_bytes(b"x")
    assert names("s3://bkt/run") == ["f"]
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    with s3_server(check_credentials=True) as strict:
        strict.create_bucket("bkt")
        monkeypatch.setenv("AWS_ENDPOINT_URL", strict.endpoint)
        with pytest.raises(storage.StorageError) as caught:
            storage.check_writable("s3://bkt/run")
    assert str(caught.value) == (
        "cannot write to s3://bkt/run: the access key is not known to the store (check AWS_ACCESS_KEY_ID)"
    )


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def no_store(monkeypatch):
    """Credentials and an endpoint as a test must always set them, and nothing at either: the endpoint, the
    instance metadata service and any proxy are closed ports of 127.0.0.1, so no request leaves it."""
    port = closed_port()
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "HTTPS_PROXY": f"http://127.0.0.1:{port}",
                        "AWS_METADATA_ENDPOINT": f"http://127.0.0.1:{port}"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT", "NO_PROXY", "no_proxy", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return port


@pytest.mark.slow  # in process, but the store's retries take seconds
@pytest.mark.parametrize("case", ["refused", "endpoint unset", "no credentials"])
def test_a_store_that_cannot_be_reached_is_named_with_where_its_endpoint_came_from(
    no_store, monkeypatch, case
):
    """#33: `connection refused` alone did not say which endpoint was asked: with AWS_ENDPOINT_URL unset (a
    local store tried, the variable forgotten) orch asks AWS itself, and without credentials the cloud's
    metadata service; each is named. The unset case goes through HTTPS_PROXY, a closed local port."""
    if case == "endpoint unset":
        monkeypatch.delenv("AWS_ENDPOINT_URL")
    if case == "no credentials":
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(storage.StorageError) as caught:
        storage.check_writable("s3://bkt/run")
    assert (
        str(caught.value)
        == "cannot write to s3://bkt/run: "
        + {
            "refused": f"the store at http://127.0.0.1:{no_store} (AWS_ENDPOINT_URL) cannot be reached (connection "
            "refused)",
            "endpoint unset": "the store at https://s3.us-east-1.amazonaws.com (AWS's own: AWS_ENDPOINT_URL is not "
            "set) cannot be reached (connection refused)",
            "no credentials": "no credentials: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY are not set and the cloud's "
            f"instance metadata service (http://127.0.0.1:{no_store}) did not give any; set them (in a pod, through "
            "secret_env)",
        }[case]
    )


@pytest.mark.slow  # in process; waits out the probe's budget
def test_an_endpoint_that_does_not_answer_fails_orch_run_fast_in_one_line(no_store, monkeypatch, tmp_path):
    """#33: a store that accepts connections and never answers held `orch run` for the whole retry budget
    (ORCH_STORAGE_RETRY_SECONDS, 3 minutes) and then said `connection refused`. The start's probe waits
    storage.PROBE_SECONDS at most, and says what happened."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # accepts (the kernel does), never reads nor answers
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        job = str(REPO_ROOT / "examples" / "digits.yaml")
        started = time.monotonic()
        result = run_orch("run", job, "--out", "s3://bkt/run", cwd=tmp_path)
        waited = time.monotonic() - started
    assert waited < storage.PROBE_SECONDS + 10
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: cannot write to s3://bkt/run: the store at {endpoint} (AWS_ENDPOINT_URL) did "
                           "not answer in ") and line.endswith(" s (timed out)")  # fmt: skip
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ftp://host/run", "scheme ftp:// is not supported (supported: s3://, gs://, az://)"),
        ("s3:///run", "'s3:///run' names no bucket (s3://BUCKET/prefix)"),
        ("s3://bucket/run", None),
        ("gs://bucket", None),
    ],
)
def test_url_problems(text, problem):
    assert storage.url_problem(text) == problem


def orch(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", *args],
        env={**os.environ, "ORCH_METRICS_PORT": "0", **env}, cwd=cwd, capture_output=True, text=True,
        timeout=400,
    )  # fmt: skip


def test_orch_run_out_s3_keeps_everything_in_the_store_and_resumes_at_another_world_size(s3, tmp_path):
    job = str(REPO_ROOT / "examples" / "digits.yaml")
    common = ("--set", "train.checkpoint.every_steps=10", "--set", "tracking.tensorboard=true")
    first = orch(job, "--steps", "20", *common, "--out", "s3://bkt/digits", env=s3.env(), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "(checkpoints, model, summary: s3://bkt/digits/)" in first.stdout
    second = orch(job, "--procs", "1", "--steps", "30", *common, "--out", "s3://bkt/digits/",
                  env=s3.env(), cwd=tmp_path)  # fmt: skip
    assert second.returncode == 0, second.stderr
    assert "resumed from s3://bkt/digits/checkpoints/step-00000020 at step 20" in second.stdout
    root = storage.location("s3://bkt/digits")
    summary = json.loads((root / "summary.json").read_text())
    assert summary["resumed_from_step"] == 20 and summary["steps"] == 30 and summary["world_size"] == 1
    assert names("s3://bkt/digits") == ["checkpoints", "goodput", "model.pt", "summary.json", "tensorboard"]
    # the goodput journal lives in the store: the second run, in a new local folder, counts the first (#31)
    assert (summary["goodput"]["attempts"], summary["goodput"]["lost_steps"]) == (2, 0)
    assert names("s3://bkt/digits/checkpoints") == ["step-00000020", "step-00000030"]
    assert any(p.name.startswith("events.out.tfevents") for p in (root / "tensorboard").iterdir())
    # the logs stay on this machine, in a new local directory per run
    assert len(list((tmp_path / "runs").iterdir())) == 2


def test_orch_run_whose_model_the_store_refuses_ends_in_one_line_and_the_rerun_writes_it(s3, tmp_path):
    """#33 through `orch run`, 2 ranks: the store refuses model.pt at the end. One line (no traceback, no
    `rank 0 failed (exit code 1): }`), exit 74 (the training finished, its results are not where asked), every
    rank ended with it, no summary.json anywhere; the same command again, with the store fixed, resumes at the
    last step from the final checkpoint and writes the results without training again."""
    job = str(REPO_ROOT / "examples" / "digits.yaml")
    common = ("--steps", "20", "--set", "train.checkpoint.every_steps=10", "--out", "s3://bkt/digits")
    with Failing(s3.endpoint, ("model.pt",), "refused") as proxy:
        failed = orch(job, *common, env=s3.env(proxy.endpoint), cwd=tmp_path)
    assert failed.returncode == exit_codes.RESULTS_NOT_KEPT, failed.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    line = (
        f"training finished at step 20, but model.pt could not be written to s3://bkt/digits (the store at "
        f"{proxy.endpoint}, AWS_ENDPOINT_URL): access denied (the credentials may not write there); no summary.json "
        "was written; check the store (its credentials, its endpoint, that it is up) and run again with the same "
        "output: it resumes from its last checkpoint and writes the results"
    )
    assert failed.stderr.splitlines()[-1] == f"error: {line}; its output: runs/{run_dir.name}/logs/rank-0.log"
    said = failed.stdout + failed.stderr
    assert "Traceback" not in said and said.count("error: ") == 1
    for rank in (0, 1):  # every rank learnt it from rank 0 and ended with it (exit 74 each)
        assert (run_dir / "logs" / f"rank-{rank}.log").read_text().rstrip().endswith(f"error: {line}")
    assert "summary.json" not in names("s3://bkt/digits") and not (run_dir / "summary.json").exists()
    again = orch(job, *common, env=s3.env(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "resumed from s3://bkt/digits/checkpoints/step-00000020 at step 20" in again.stdout
    summary = json.loads((storage.location("s3://bkt/digits") / "summary.json").read_text())
    assert (summary["resumed_from_step"], summary["steps"]) == (20, 20)
    assert "model.pt" in names("s3://bkt/digits")


def test_orch_run_refuses_an_unusable_store_in_one_line_before_starting(s3, tmp_path):
    """In process (tests/fakes/cli.py: main() as the console script runs it): the refusal comes before anything
    starts, and the watch of tests/tiers.py fails this test if orch run started a process anyway."""
    job = str(REPO_ROOT / "examples" / "digits.yaml")
    missing = run_orch("run", job, "--out", "s3://no-such-bucket/run", cwd=tmp_path)
    assert (missing.returncode, missing.stderr) == (
        2, "error: cannot write to s3://no-such-bucket/run: the bucket does not exist\n"
    )  # fmt: skip
    # #33: a train.checkpoint.dir URL is checked as well (it was not: the ranks found out, after starting)
    checkpoints = run_orch("run", job, "--set", "train.checkpoint.dir=s3://no-such-bucket/ckpt", cwd=tmp_path)
    assert (checkpoints.returncode, checkpoints.stderr) == (
        2, "error: cannot write to s3://no-such-bucket/ckpt: the bucket does not exist\n"
    )  # fmt: skip
    unsupported = run_orch("run", job, "--out", "ftp://host/run", cwd=tmp_path)
    assert (unsupported.returncode, unsupported.stderr) == (
        2, "error: --out ftp://host/run: scheme ftp:// is not supported (supported: s3://, gs://, az://)\n"
    )  # fmt: skip
    assert not (tmp_path / "runs").exists()  # nothing half-done on disk


def test_a_stream_reads_its_tar_shards_from_the_store(s3, tmp_path):
    """docs/tasks.md's example: shards in the bucket, read as streams (tarfile `r|`, no seek) through
    storage.location; every sample of the epoch once over two ranks."""
    import tarfile

    from orchestrator.trainer.data import Layout, ShardedStream, _RankStream
    from tests.trainer.stream_tasks import write_shards

    write_shards(tmp_path / "shards", shards=4, per_shard=8)
    urls = []
    for path in sorted((tmp_path / "shards").iterdir()):
        url = f"s3://bkt/shards/{path.name}"
        storage.upload(path, storage.location(url))
        urls.append(url)

    def read_shard(url: str):
        with storage.location(url).open("rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                yield torch.tensor(int(member.name.split(".")[0]))

    stream = ShardedStream(shards=tuple(urls), sizes=(8,) * 4, read=read_shard, buffer_size=4)
    layout = Layout(dataset_size=32, batch_size=8, micro_batch_size=4, world_size=2, seed=0)
    seen = [
        int(i) for rank in range(2) for batch in _RankStream(stream, layout, rank, 0, 4, 0) for i in batch
    ]
    assert sorted(seen) == list(range(32))


def test_a_pod_whose_store_cannot_be_written_stops_at_start_in_one_line(s3, tmp_path):
    """In a pod no `orch run` checks first: rank 0 of the trainer does, before building anything."""
    from orchestrator import runtime_env
    from orchestrator.trainer.config import TrainSpec

    config = tmp_path / "train.json"
    config.write_text(runtime_env.train_json(TrainSpec(task="synthetic", batch_size=16, max_steps=2)))
    env = {**os.environ, **s3.env(), "ORCH_OUTPUT_DIR": str(tmp_path / "out"),
           "ORCH_OUTPUT_URL": "s3://no-such-bucket/run"}  # fmt: skip
    env.pop("ORCH_METRICS_PORT", None)
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.trainer", "--config", str(config)],
        env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: cannot write to s3://no-such-bucket/run: the bucket does not exist"
    )
    assert "Traceback" not in result.stderr


# --- one run per prefix: the lease (#33) ------------------------------------------------------------------------

LEASE_URL = "s3://bkt/run/.checkpoints.orch-lock"


def write_holder(url: str, holder: dict) -> str:
    """The lease object as another machine's run writes it; its ETag."""
    import obstore

    store, key = storage.object_store(url)
    return obstore.put(store, key, json.dumps(holder).encode())["e_tag"]


def test_a_lease_from_another_machine_is_taken_over_only_once_it_stops_being_renewed(s3):
    """A run on another machine: renewed, it keeps the prefix (the newcomer waits 1.5 leases, then is refused);
    no longer renewed (its node died), the newcomer takes it over after one lease, saying it waits. A holder
    whose lease was taken over (it could not renew in time) learns it at its next renewal."""
    import threading

    other = {
        "job": "other-job",
        "host": "node-7",
        "pid": 12,
        "machine": "another-boot/pid:[1]",
        "started": "5",
    }
    write_holder(LEASE_URL, other)
    renewing = threading.Event()

    def renew():
        while not renewing.wait(0.2):
            write_holder(LEASE_URL, {**other, "renewed": time.time()})

    renewer = threading.Thread(target=renew, daemon=True)
    renewer.start()
    newcomer, said = storage.Lease(LEASE_URL, lease_seconds=1), []
    with pytest.raises(storage.LeaseHeld) as caught:
        newcomer.acquire(say=said.append)
    renewing.set()
    renewer.join()
    assert str(caught.value).startswith(
        f"{LEASE_URL} is held by another run (job other-job, host node-7, pid 12)"
    )
    started = time.monotonic()
    said.clear()
    assert newcomer.acquire(say=said.append)  # the holder stopped renewing: after a lease unchanged, taken
    assert time.monotonic() - started >= 1
    assert said == [f"waiting up to 1.5 s for {LEASE_URL}, held by node-7 pid 12: taken over if it is not renewed "
                    "in that time (a run that was killed)"]  # fmt: skip
    # the old holder comes back and writes its lease again: the newcomer's next renewal sees another run
    write_holder(LEASE_URL, other)
    deadline = time.monotonic() + 10
    while newcomer.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert newcomer.lost == (
        f"{LEASE_URL} was taken over by another run (job other-job, host node-7, pid 12) while this one could not "
        "renew it for 1 s: this run stops writing there"
    )
    newcomer.release()
    assert json.loads(storage.location(LEASE_URL).read_bytes())["host"] == "node-7"  # not deleted: not ours


HOLD_SCRIPT = """
import sys, time
sys.path.insert(0, {repo!r})
from orchestrator import storage
assert storage.Lease({url!r}, lease_seconds=60).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_run_on_a_prefix_is_refused_at_once_and_a_killed_ones_lease_taken_over_at_once(s3):
    """A run of this machine holds the prefix: a second is refused at once, naming it (no waiting: its process
    is alive). kill -9 leaves the lease object behind, but its holder's process is gone, which this machine
    can tell at once: taken over without waiting for the lease to run out. Released, the object is gone."""
    script = HOLD_SCRIPT.format(repo=str(REPO_ROOT), url=LEASE_URL)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lease = storage.Lease(LEASE_URL, lease_seconds=60)
        started = time.monotonic()
        with pytest.raises(storage.LeaseHeld) as caught:
            lease.acquire()
        assert time.monotonic() - started < 10
        assert str(caught.value) == (
            f"{LEASE_URL} is held by another run (host {lease.me['host']}, pid {holder.pid}), renewed within the "
            "last 60 s: one run at a time per prefix; wait for it to finish, or give this run its own prefix"
        )
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    started = time.monotonic()
    assert lease.acquire(say=pytest.fail)  # nothing to wait for, nothing said
    assert time.monotonic() - started < 10
    assert storage.Lease(LEASE_URL).acquire() is False  # this process holds it already
    lease.release()
    assert names("s3://bkt/run") == []
