"""Flag values attacked (issue #33): `orch logs --ranks/--rank/--max-log-requests`, `orch wait --timeout`,
`--request-timeout`. A bad value is one `error:` line naming the flag, exit 2, and no request is sent; a
rank the job does not have is the same, after the one read that tells. Real requests to the emulator."""

from __future__ import annotations

import pytest

from tests.cluster.test_faults import one_error_line

BAD_FLAGS = [
    (("logs", "demo", "--ranks", "-1"), "Invalid value for '--ranks': '-1' is not a rank or a range like 0-63"),
    (("logs", "demo", "--ranks", "5-3"), "Invalid value for '--ranks': '5-3': the range ends before it starts"),
    (("logs", "demo", "--ranks", "abc"), "Invalid value for '--ranks': 'abc' is not a rank or a range like 0-63"),
    (("logs", "demo", "--ranks", ","), "Invalid value for '--ranks': no ranks given (e.g. 0-63)"),
    (("logs", "demo", "--ranks", "0--3"), "Invalid value for '--ranks': '0--3' is not a rank or a range"),
    (("logs", "demo", "--ranks", "1" * 40), "Invalid value for '--ranks': '111111111111111111111111111..."),
    (("logs", "demo", "--ranks", "0-2147483647"), "'0-2147483647': 2147483647 is past the last rank a job"),
    # before: a set of a trillion numbers was built, and the kernel killed orch (exit 137)
    (("logs", "demo", "--ranks", "0-999999999"), "more than 100000 ranks; --all shows every pod"),
    (("logs", "demo", "--ranks", "0-60000,0-60000"), "more than 100000 ranks; --all shows every pod"),
    (("logs", "demo", "--ranks", "٣"), "'٣' is not a rank or a range like 0-63"),
    (("logs", "demo", "--rank", "-1"), "Invalid value for '--rank': -1 is not in the range"),
    (("logs", "demo", "--rank", "99999999999999999999"), "Invalid value for '--rank': 99999999999999999999 is not"),
    (("logs", "demo", "--max-log-requests", "0"), "Invalid value for '--max-log-requests': 0 is not in the range"),
    (("logs", "demo", "--max-log-requests", "-5"), "Invalid value for '--max-log-requests': -5 is not in the range"),
    (("logs", "demo", "--max-log-requests", "1000000"), "'--max-log-requests': 1000000 is not in the range 1<=x<=100"),
    (("logs", "demo", "--max-log-requests", "many"), "Invalid value for '--max-log-requests': 'many' is not a valid"),
    (("wait", "demo", "--timeout", "0"), "Invalid value for '--timeout': must be longer than 0 seconds"),
    (("wait", "demo", "--timeout", "-5"), "Invalid value for '--timeout': '-5' is not a duration"),
    (("wait", "demo", "--timeout", "5x"), "Invalid value for '--timeout': '5x' is not a duration"),
    (("wait", "demo", "--timeout", "1e3"), "Invalid value for '--timeout': '1e3' is not a duration"),
    (("wait", "demo", "--timeout", "99999999999w"), "seconds is longer than the bound, 2147483647 (68 years)"),
    (("list", "--request-timeout", "-1"), "Invalid value for '--request-timeout': '-1' is not a duration"),
    (("list", "--request-timeout", "nan"), "Invalid value for '--request-timeout': 'nan' is not a duration"),
    (("status", "demo", "--request-timeout", "1.5s"), "'--request-timeout': '1.5s' is not a duration"),
    (("list", "--request-timeout", "9" * 30 + "w"), "seconds is longer than the bound, 2147483647"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"), BAD_FLAGS, ids=lambda a: " ".join(a) if isinstance(a, tuple) else ""
)
def test_a_bad_flag_value_is_one_line_exit_2_and_sends_nothing(env, args, expected):
    """Before: click's four lines (Usage, Try, a blank, `Error: ...`), not orch's one `error:` line."""
    result = env.orch(*args)
    assert result.exit_code == 2, result.stderr
    line = one_error_line(result.stderr)
    assert expected in line, line
    assert line.endswith(f"(see orch {args[0]} --help)"), line
    assert result.stderr.count("\n") == 1, result.stderr
    assert env.kube.requests() == []


def test_a_usage_error_without_a_value_is_one_line_too(env):
    for args, expected in (
        (("logs",), "error: Missing argument 'NAME'. (see orch logs --help)"),
        (("logs", "demo", "--folow"), "error: No such option '--folow'"),
        (("nope",), "error: No such command 'nope'. (see orch --help)"),
    ):
        result = env.orch(*args)
        assert result.exit_code == 2
        assert one_error_line(result.stderr).startswith(expected)


@pytest.mark.parametrize("follow", [False, True], ids=["logs", "logs -f"])
@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (("--ranks", "3-9"), "--ranks 3-9: job demo has 3 nodes, ranks 0-2"),
        (("--ranks", "70"), "--ranks 70: job demo has 3 nodes, ranks 0-2"),
        (("--rank", "3"), "--rank 3: job demo has 3 nodes, ranks 0-2"),
    ],
)
def test_ranks_the_job_does_not_have(env, job_file, flags, expected, follow):
    """Before: `has no pod with those ranks (yet)` and exit 0; with -f, orch waited for pods that never come
    until the job ended. Ranks some of which exist show those (below)."""
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions("team-a", "demo", ("Created", "True"), ("Running", "True"))
    result = env.orch("logs", "demo", *flags, *(("-f",) if follow else ()))
    assert result.exit_code == 2, result.stderr
    assert one_error_line(result.stderr) == f"error: {expected}"


def test_ranks_some_of_which_exist_show_those(env, job_file):
    assert env.orch("submit", str(job_file)).exit_code == 0
    env.kube.set_conditions("team-a", "demo", ("Created", "True"), ("Running", "True"))
    for role, index in (("master", 0), ("worker", 0), ("worker", 1)):
        pod = env.kube.add_pod("team-a", "demo", role, index)
        env.kube.write_log("team-a", pod, f"{role} {index} says hello")
        env.kube.end_log("team-a", pod)
    result = env.orch("logs", "demo", "--ranks", "2-99999")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == ["[worker-1] worker 1 says hello"]
