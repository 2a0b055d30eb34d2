"""#33: the one restart rule of both launchers (orchestrator/exit_codes.py), and what `orch run` says when it
ended the restarts, in process. The rule applied by torch's real agent is tested with real processes in
tests/spec/test_exit_codes.py (`orch run` and a pod's torchrun under restart.policy job)."""

from __future__ import annotations

import os
import signal

from orchestrator import exit_codes, launch
from orchestrator.local import processes
from tests.trainer.test_exit_classes import LOCAL, Failed, Failure, raised


def test_a_restart_can_change_every_failure_but_a_refusal():
    assert exit_codes.restartable([1]) and exit_codes.restartable([-signal.SIGKILL, 1])
    assert exit_codes.restartable([143, 200])  # a stop after its checkpoint, hardware: another attempt may do
    assert not exit_codes.restartable([2]) and not exit_codes.restartable([127])
    # the ranks the launcher stopped after a refusal do not make it retryable
    assert not exit_codes.restartable([-signal.SIGTERM, exit_codes.RESULTS_NOT_KEPT])


def test_orch_runs_line_says_the_refusal_was_not_restarted_and_counts_the_restarts_made(tmp_path):
    refused = Failure(
        0, 2, error_file_data={"message": {"message": "DataChanged: other shards", "extraInfo": {}}}
    )
    line, code = processes._failure_message(
        Failed({0: refused, 1: Failure(1, -signal.SIGTERM)}), LOCAL, tmp_path, launch.Restarts(1, 2)
    )
    assert code == 2
    assert line == (
        "rank 0 failed after 1 restart (exit code 2, not restarted: a restart would end the same way): DataChanged: "
        f"other shards; its output: {tmp_path}/rank-0.log"
    )


def test_results_not_kept_are_said_in_the_ranks_own_words_with_its_exit_code(tmp_path):
    said = "training finished at step 20, but model.pt could not be written to s3://b/r: access denied; ..."
    failure = Failure(
        0, exit_codes.RESULTS_NOT_KEPT, error_file_data=raised(0, f"ResultsNotKept: {said}").error_file_data
    )
    line, code = processes._failure_message(
        Failed({0: failure, 1: Failure(1, -signal.SIGTERM)}), LOCAL, tmp_path
    )
    assert (line, code) == (f"{said}; its output: {tmp_path}/rank-0.log", 74)


def test_results_not_kept_on_every_rank_name_rank_0_whose_write_failed(tmp_path):
    """Every rank exits 74 at once (rank 0 tells them); the line names rank 0's log, which holds the failed
    write, even where another rank's error file is the older one (the order torch's records would give)."""
    said = "training finished at step 20, but model.pt could not be written to s3://b/r: access denied; ..."
    files = {rank: tmp_path / f"error-{rank}.json" for rank in (0, 1)}
    for rank, written_ns in ((0, 2 * 10**18), (1, 2 * 10**18 - 10**9)):  # rank 1's a second older
        files[rank].write_text("{}")
        os.utime(files[rank], ns=(written_ns, written_ns))
    failures = {
        rank: Failure(
            rank,
            exit_codes.RESULTS_NOT_KEPT,
            error_file=str(files[rank]),
            error_file_data=raised(rank, f"ResultsNotKept: {said}").error_file_data,
        )
        for rank in (1, 0)
    }
    assert os.stat(files[1]).st_mtime_ns < os.stat(files[0]).st_mtime_ns
    line, code = processes._failure_message(Failed(failures), LOCAL, tmp_path)
    assert (line, code) == (f"{said}; its output: {tmp_path}/rank-0.log", 74)
