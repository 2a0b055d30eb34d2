"""The test tiers, decided for every test at collection and checked while it runs (docs/testing.md).

`make test` (the fast tier) runs `-m "not slow or smoke"`; `make test-all` runs everything. A test is `slow` when
it starts a child process (torch workers, `orch` as a subprocess, torchrun, an MLflow/Prometheus/S3 server, buildah,
kubectl, ...). Nobody has to remember to mark it:

1. At collection, `launch` (and with it `slow`) is set on a test when its own code, a fixture it uses (directly or
   through other fixtures) or a helper function or class of tests/ that those call reaches `subprocess`,
   `multiprocessing`, `torch.multiprocessing`, `os.fork`/`os.system`/`os.posix_spawn` or asyncio's subprocesses.
   The search follows names through the modules' globals, so `orch_run(...)`, `run_job`, `mlflow_server`,
   `live_prometheus`, `start_driver(...)` are all found without a list of them, and so is a helper decorated
   `@starts_a_process` (e.g. `require_tool("buildah")`: the test will run buildah).
2. While a test runs, process creation is watched (`subprocess.Popen`, `os.fork`, multiprocessing's spawn). A test
   that was not classified `launch` and still starts a process (e.g. it calls code in orchestrator/ that runs
   torchrun) fails, saying to mark it `@pytest.mark.launch`. So the classification cannot silently be wrong.

`smoke` (set by hand) keeps an end-to-end test that launches in the fast tier: one per path. `slow` may also be set
by hand on an in-process test that is slow. Tests that share an expensive fixture scoped wider than a function
(a session's MLflow server, a module's training run) get one `xdist_group`, so `--dist loadgroup` runs them on one
worker and the fixture is built once per test run instead of once per worker.
"""

from __future__ import annotations

import inspect
import multiprocessing.util
import os
import subprocess
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent

# Module -> the attributes of it that start a process. A module reached with any of these names in the same code
# object counts; the module alone (e.g. `subprocess.PIPE`, `os.environ`) does not.
_SPAWNING_ATTRIBUTES = {
    "subprocess": {"Popen", "run", "call", "check_call", "check_output", "getoutput", "getstatusoutput"},
    "os": {
        "fork",
        "forkpty",
        "system",
        "popen",
        "posix_spawn",
        "posix_spawnp",
        "spawnv",
        "spawnve",
        "spawnl",
        "spawnle",
        "spawnvp",
        "spawnlp",
        "execv",
        "execve",
        "execvp",
    },  # fmt: skip
    "multiprocessing": {"Process", "Pool", "get_context"},
    "torch.multiprocessing": {"spawn", "start_processes", "Process", "Pool", "get_context"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
    "asyncio.subprocess": {"create_subprocess_exec", "create_subprocess_shell"},
    "pty": {"spawn", "fork"},
}
# Programs a library may run to probe the system (ctypes.util.find_library, platform): not a launch.
_PROBES = {"ldconfig", "uname", "gcc", "cc", "objdump", "ld", "ld.bfd", "lsb_release", "x86_64-linux-gnu-gcc"}


def _spawner_objects() -> dict[int, str]:
    """id -> name of the functions and classes that start a process, when imported by name."""
    found: dict[int, str] = {}
    for module_name, attributes in _SPAWNING_ATTRIBUTES.items():
        module = _loaded_module(module_name)
        for attribute in attributes:
            value = getattr(module, attribute, None) if module else None
            if value is not None and not isinstance(value, types.ModuleType):
                found[id(value)] = f"{module_name}.{attribute}"
    return found


def _loaded_module(name: str) -> types.ModuleType | None:
    import sys

    return sys.modules.get(name)


def _is_test_code(obj: Any) -> bool:
    """A function or class of the tests (under tests/, or in any test_*.py or conftest.py): the search follows
    these; it stops at library and orchestrator/ code (their processes are the watch's to find)."""
    try:
        source = inspect.getsourcefile(obj)
    except (TypeError, OSError):
        return False
    if source is None:
        return False
    path = Path(source).resolve()
    return path.is_relative_to(TESTS) or path.name.startswith("test_") or path.name == "conftest.py"


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


class _Classifier:
    """Whether a function reaches a process start, following tests/ helpers; answers cached per object."""

    def __init__(self) -> None:
        self._spawners = _spawner_objects()
        self._cache: dict[int, str | None] = {}

    def reason(self, obj: Any, _depth: int = 0) -> str | None:
        """What `obj` (a function, method or class of tests/) starts, e.g. "subprocess.run", or None."""
        obj = inspect.unwrap(obj)
        inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)  # @given wraps the test
        if inner is not None:
            obj = inner
        key = id(obj)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = None  # recursion guard
        answer = self._search(obj, _depth)
        self._cache[key] = answer
        return answer

    def _search(self, obj: Any, depth: int) -> str | None:
        if depth > 12:
            return None
        if inspect.isclass(obj):
            for member in vars(obj).values():
                function = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
                if isinstance(member, property):
                    function = member.fget
                if inspect.isfunction(function) and (found := self.reason(function, depth + 1)):
                    return f"{obj.__name__}.{function.__name__} -> {found}"
            return None
        code = getattr(obj, "__code__", None)
        if not isinstance(code, types.CodeType):
            return None
        namespace = dict(getattr(obj, "__globals__", {}))
        for cell_name, cell in zip(code.co_freevars, getattr(obj, "__closure__", None) or (), strict=False):
            try:
                namespace[cell_name] = cell.cell_contents
            except ValueError:  # an empty cell
                continue
        for each in _code_objects(code):
            names = set(each.co_names) | set(each.co_freevars)
            for module_name in names & _SPAWNING_ATTRIBUTES.keys():  # `import subprocess` inside the function
                if spawning := _SPAWNING_ATTRIBUTES[module_name] & names:
                    return f"{module_name}.{sorted(spawning)[0]}"
            for name in sorted(names):
                value = namespace.get(name)
                if value is None:
                    continue
                if isinstance(value, types.ModuleType):
                    spawning = _SPAWNING_ATTRIBUTES.get(value.__name__, set()) & names
                    if spawning:
                        return f"{value.__name__}.{sorted(spawning)[0]}"
                    continue
                if spawner := self._spawners.get(id(value)):
                    return spawner
                if getattr(value, "starts_a_process", False):  # see `starts_a_process` below
                    return name
                if (inspect.isfunction(value) or inspect.isclass(value)) and _is_test_code(value):
                    found = self.reason(value, depth + 1)
                    if found:
                        return f"{name} -> {found}" if not found.startswith(f"{name} ") else found
        return None


@contextmanager
def shared_fixture_teardown() -> Iterator[None]:
    """Wrap the teardown of a launching fixture scoped wider than a test when it starts a process (e.g. removing a
    session's image with buildah): pytest runs that teardown in the teardown of whichever test used the fixture
    last or came last, which may be an in-process test. The process is the fixture's, so the watch looks away."""
    saved = _Watch.current
    _Watch.current = None
    try:
        yield
    finally:
        _Watch.current = saved


def starts_a_process(function: Any) -> Any:
    """Declares that calling `function` means a process will run (e.g. `require_tool`: the test runs the tool),
    for helpers whose process is started by code outside tests/ where the search does not look."""
    function.starts_a_process = True
    return function


def _launching_fixtures(item: pytest.Item, classifier: _Classifier) -> dict[str, tuple[str, str, str]]:
    """Fixture name -> (scope, baseid, what it starts) for the fixtures of `item` that start a process."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return {}
    found = {}
    for name in item.fixturenames:  # type: ignore[attr-defined]
        for fixturedef in info.name2fixturedefs.get(name, ()):
            reason = classifier.reason(fixturedef.func)
            if reason:
                found[name] = (fixturedef.scope, fixturedef.baseid, reason)
                break
    return found


class _Groups:
    """Union-find over the shared launching fixtures, so tests that share one end up in one xdist group."""

    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, key: str) -> str:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def union(self, keys: list[str]) -> None:
        roots = sorted({self.find(key) for key in keys})
        for root in roots[1:]:
            self.parent[root] = roots[
                0
            ]  # the smallest name is the root: the same group names on every worker


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--why-slow", action="store_true", help="print why tests/tiers.py put each test in the full tier"
    )


def pytest_configure(config: pytest.Config) -> None:
    _Watch.install()  # the markers themselves are described in pyproject.toml


@pytest.hookimpl(tryfirst=True)  # before -m deselects and before xdist reads xdist_group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    classifier = _Classifier()
    groups = _Groups()
    shared: dict[str, list[str]] = {}
    for item in items:
        reasons = []
        if item.get_closest_marker("launch") is not None:
            reasons.append("marked launch")
        function = getattr(item, "function", None)
        if function is not None and (found := classifier.reason(function)):
            reasons.append(found)
        fixtures = _launching_fixtures(item, classifier)
        reasons += [f"fixture {name} -> {reason}" for name, (_, _, reason) in fixtures.items()]
        if not reasons:
            continue
        item.stash[_LAUNCHES] = reasons[0]
        if config.getoption("why_slow"):
            print(f"{item.nodeid}: {reasons[0]}")
        if item.get_closest_marker("launch") is None:
            item.add_marker(pytest.mark.launch)
        if item.get_closest_marker("smoke") is None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        keys = [
            f"{name}@{baseid}" if scope != "session" else name
            for name, (scope, baseid, _) in fixtures.items()
            if scope != "function"
        ]
        if keys:
            groups.union(keys)
            shared[item.nodeid] = keys
    for item in items:
        if item.nodeid in shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(groups.find(shared[item.nodeid][0])))


_LAUNCHES = pytest.StashKey[str]()


class _Watch:
    """Records process starts during a test that was not classified `launch` (see the module docstring)."""

    current: pytest.Item | None = None
    started: list[str] = []
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        cls.installed = True
        original_init = subprocess.Popen.__init__

        def popen_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            cls.saw(args)
            original_init(self, args, *rest, **kwargs)

        subprocess.Popen.__init__ = popen_init  # type: ignore[method-assign]
        original_spawnv = multiprocessing.util.spawnv_passfds

        def spawnv_passfds(path: Any, args: Any, passfds: Any) -> Any:
            cls.saw(args)
            return original_spawnv(path, args, passfds)

        multiprocessing.util.spawnv_passfds = spawnv_passfds
        os.register_at_fork(before=lambda: cls.saw(["os.fork"]))

    @classmethod
    def saw(cls, args: Any) -> None:
        if cls.current is None:
            return
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0])).split()[0] if argv else "?"
        if program in _PROBES:
            return
        cls.started.append(" ".join(os.fsdecode(a) for a in argv)[:200])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    saved = (_Watch.current, _Watch.started)  # pytester runs sessions inside a test
    _Watch.current = None if _LAUNCHES in item.stash else item
    _Watch.started = []
    try:
        yield
    finally:
        _Watch.current, _Watch.started = saved


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if _Watch.current is item and _Watch.started and report.passed:
        started, _Watch.started = _Watch.started, []
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process ({started[0]!r}{', ...' if len(started) > 1 else ''}) during "
            f"{report.when}, but tests/tiers.py did not see it coming, so it would run in the fast tier. "
            "Mark it @pytest.mark.launch (docs/testing.md)."
        )
