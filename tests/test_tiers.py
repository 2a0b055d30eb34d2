"""tests/tiers.py: the tier of a test is decided from what its code reaches, and a process it starts unseen fails
it. These run the classifier on small test files in a pytester folder (in-process sessions)."""

from __future__ import annotations

import textwrap

import pytest


@pytest.fixture(autouse=True)
def _ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")


HELPERS = """
import subprocess

def run_tool(*args):
    return subprocess.run(["true", *args], check=True)

class Server:
    def __init__(self):
        self.process = None

    def start(self):
        self.process = subprocess.Popen(["sleep", "60"])
"""


def tiers(pytester: pytest.Pytester, source: str, *args: str) -> dict[str, set[str]]:
    """Test name -> the names of its markers, as collected with tests/tiers.py."""
    pytester.makepyfile(test_sample=textwrap.dedent(source))
    items, _ = pytester.inline_genitems("-p", "tests.tiers", *args)
    return {item.name: {mark.name for mark in item.iter_markers()} for item in items}


def test_in_process_tests_stay_in_the_fast_tier(pytester: pytest.Pytester) -> None:
    marks = tiers(
        pytester, "import os, subprocess\n\ndef test_pure():\n    assert os.environ and subprocess.PIPE\n"
    )
    assert "launch" not in marks["test_pure"] and "slow" not in marks["test_pure"]


def test_a_process_reached_through_helpers_and_fixtures_is_found(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(HELPERS + "\nimport pytest\n\n@pytest.fixture\ndef server():\n    yield Server()\n")
    marks = tiers(
        pytester,
        """
        from conftest import run_tool

        def helper():
            return run_tool("x")

        def test_through_a_helper():
            helper()

        def test_through_a_fixture(server):
            server.start()

        def test_local_import():
            import torch.multiprocessing as mp
            mp.spawn(print, nprocs=2)

        def test_smoke_stays(server):
            pass
        """,
    )
    for name in ("test_through_a_helper", "test_through_a_fixture", "test_local_import"):
        assert {"launch", "slow"} <= marks[name], name
    assert {"launch", "slow"} <= marks["test_smoke_stays"]  # not marked smoke: full tier


def test_smoke_keeps_a_launching_test_in_the_fast_tier(pytester: pytest.Pytester) -> None:
    source = (
        "import pytest, subprocess\n\n@pytest.mark.smoke\ndef test_e2e():\n    subprocess.run(['true'])\n"
    )
    marks = tiers(pytester, source)
    assert "launch" in marks["test_e2e"] and "slow" not in marks["test_e2e"]


def test_tests_sharing_a_launching_fixture_share_an_xdist_group(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        HELPERS
        + textwrap.dedent(
            """
            import pytest

            @pytest.fixture(scope="session")
            def shared_server():
                yield Server()

            @pytest.fixture(scope="module")
            def training_run():
                return run_tool()
            """
        )
    )
    pytester.makepyfile(
        test_sample=textwrap.dedent(
            """
            def test_a(shared_server): pass
            def test_b(shared_server, training_run): pass
            def test_c(training_run): pass
            def test_d(): pass
            """
        )
    )
    items, _ = pytester.inline_genitems("-p", "tests.tiers")
    groups = {item.name: [m.args[0] for m in item.iter_markers("xdist_group")] for item in items}
    assert groups["test_a"] == groups["test_b"] == groups["test_c"] and len(groups["test_a"]) == 1
    assert groups["test_d"] == []


@pytest.mark.launch  # the inner test runs `true`
def test_a_process_the_classifier_did_not_see_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        hidden="import subprocess\n\ndef start():\n    subprocess.run(['true'], check=True)\n"
    )
    pytester.makepyfile(
        test_sample="import hidden\n\ndef test_unseen():\n    hidden.start()\n\n"
        "import pytest\n\n@pytest.mark.launch\ndef test_declared():\n    hidden.start()\n"
    )
    result = pytester.inline_run("-p", "tests.tiers")
    passed, _, failed = result.listoutcomes()
    assert [r.nodeid.split("::")[-1] for r in passed] == ["test_declared"]
    assert [r.nodeid.split("::")[-1] for r in failed] == ["test_unseen"]
    assert "Mark it @pytest.mark.launch" in str(failed[0].longrepr)


@pytest.mark.launch  # the inner session's fixture runs `true`
def test_a_shared_fixture_may_start_a_process_in_its_teardown(pytester: pytest.Pytester) -> None:
    """pytest tears a session fixture down in the teardown of the last test, here an in-process one."""
    pytester.makeconftest(
        "import subprocess, pytest\nfrom tests.tiers import shared_fixture_teardown\n\n"
        "@pytest.fixture(scope='session')\ndef image():\n    subprocess.run(['true'], check=True)\n    yield\n"
        "    with shared_fixture_teardown():\n        subprocess.run(['true'], check=True)\n"
    )
    pytester.makepyfile(test_sample="def test_build(image):\n    pass\n\ndef test_in_process():\n    pass\n")
    result = pytester.inline_run("-p", "tests.tiers")
    passed, _, failed = result.listoutcomes()
    assert [r.nodeid.split("::")[-1] for r in passed] == ["test_build", "test_in_process"]
    assert failed == [], failed[0].longrepr  # no error at test_in_process's teardown


@pytest.mark.launch  # xdist starts its workers as processes
def test_loadgroup_sends_a_group_to_one_worker(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grouping above only helps if xdist applies it: pytest 9 stopped reading the node id pytest-xdist 3.8
    rewrites to carry the group, and `--dist loadgroup` then spread a group over every worker (pyproject pins
    pytest<9). Six grouped tests on three workers must all report the same worker."""
    pytester.makepyfile(
        test_grouped=textwrap.dedent(
            """
            import os, pytest

            @pytest.mark.xdist_group("shared")
            @pytest.mark.parametrize("i", range(6))
            def test_grouped(i):
                with open(os.path.join(os.environ["GROUP_OUT"], f"worker-{i}"), "w") as out:
                    out.write(os.environ["PYTEST_XDIST_WORKER"])
            """
        )
    )
    out = pytester.mkdir("out")
    monkeypatch.setenv("GROUP_OUT", str(out))
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "loadgroup", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)
    workers = {p.read_text() for p in out.iterdir()}
    assert len(workers) == 1, f"one xdist_group ran on workers {sorted(workers)}"
