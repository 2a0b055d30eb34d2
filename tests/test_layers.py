"""The package's layers (docs/decisions.md, "What lives where"): no import circles, and nothing outside the
trainer imports it (its launchers start it as a process and meet it in the output directory, outputs.py).

Every import counts, wherever it is written (module level, inside a function, under TYPE_CHECKING): a lazy
import is still a dependency, only a cheaper one. An import names the module it reaches (`from orchestrator
import api` -> orchestrator.api; `from orchestrator.cluster.client import Cluster` ->
orchestrator.cluster.client), like import-linter does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "orchestrator"
TRAINER = ("orchestrator.trainer",)
# The trainer's config lives beside the trainer (its owner) and imports no torch and nothing else of the
# trainer; the modules that hand it to the trainer may import it, that module only: the job spec, whose
# `train:` section it is, runtime_env, which writes it into train.json and reads it back in the trainer, and
# `orch run`'s plan, which holds the train section it writes (with --steps applied).
TRAINER_CONFIG = "orchestrator.trainer.config"
TRAINER_CONFIG_USERS = ("orchestrator.job.spec", "orchestrator.runtime_env", "orchestrator.local.planning")


def within(name: str, packages: tuple[str, ...]) -> bool:
    """`name` is one of `packages` or inside one (orchestrator.trainers is not in orchestrator.trainer)."""
    return any(name == package or name.startswith(package + ".") for package in packages)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(path: Path) -> set[str]:
    """The orchestrator modules `path` imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in MODULES else node.module)
    return {name for name in found if name in MODULES}


GRAPH = {name: imported(path) - {name} for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert cycles(GRAPH) == []


def test_nothing_outside_the_trainer_imports_it():
    """`orch run` (local/) and a pod's launch.py start the trainer as a process; what they read back of it
    (summary.json, the links, the progress events' formats) is outputs.py's. The one exception is the
    trainer's config, which the modules that hand it to the trainer import (TRAINER_CONFIG_USERS)."""
    importers = {
        (name, target)
        for name, targets in GRAPH.items()
        if not within(name, TRAINER)
        for target in targets
        if within(target, TRAINER) and not (target == TRAINER_CONFIG and name in TRAINER_CONFIG_USERS)
    }
    assert importers == set()


def test_the_trainer_config_imports_nothing_else_of_the_trainer():
    """What the job spec imports of the trainer stays light: no other trainer module (they import torch)."""
    assert {t for t in GRAPH[TRAINER_CONFIG] if within(t, TRAINER)} == set()


# The layers of docs/decisions.md ("What lives where"), lowest first: a module imports only from its own layer or
# a lower one. Every module of the package is placed by the longest prefix that names it, so a new module fails
# `test_every_import_goes_down_the_layers` until it is given a layer here (and in the docs).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "names and data",
        (
            "orchestrator",  # the package: its version
            "orchestrator.naming",
            "orchestrator.errors",
            "orchestrator.redaction",
            "orchestrator.outputs",
            "orchestrator.hardware",  # hardware failures: exit code, signatures, the pod's record (stdlib)
            "orchestrator.exit_codes",  # the ranks' own exit codes and the launchers' restart rule (stdlib)
            "orchestrator.goodput",  # the goodput journal's records and their accounting (stdlib)
            "orchestrator.stacks",  # every rank's stack on demand: OUT's rank records, the store's requests
            "orchestrator.storage",
            "orchestrator.kube",
            "orchestrator.apis.registry",
            "orchestrator.job",  # the package (imports nothing), durations, yaml_positions, fields, spec
            "orchestrator.rendering",  # the package (imports nothing)
            "orchestrator.rendering.pod_shape",
            "orchestrator.rendering.parts",
            "orchestrator.rendering.templates",
            "orchestrator.rendering.precompiled",  # Jinja2's code of manifests/ (generated; imports jinja2 only)
            "orchestrator.imaging.ignorefile",
            TRAINER_CONFIG,
        ),
    ),
    (
        "pure translation",
        (
            "orchestrator.runtime_env",
            "orchestrator.launch",  # a pod's PID 1: the env names it reads are written by rendering/pod.py
            "orchestrator.rendering.scheduling",
            "orchestrator.rendering.tracking_record",
            "orchestrator.rendering.pod",
            "orchestrator.rendering.render",
            "orchestrator.apis",
            "orchestrator.status",
            "orchestrator.job.loading",
        ),
    ),
    (
        "I/O",
        (
            "orchestrator.cluster",
            "orchestrator.imaging",
            "orchestrator.local",
            "orchestrator.trainer",  # started as a process; imports nothing above the data layer but runtime_env
            "orchestrator.top",
            "orchestrator.doctor",
            "orchestrator.sweep",
        ),
    ),
    ("Python API", ("orchestrator.api",)),
    ("CLI", ("orchestrator.cli", "orchestrator.commands", "orchestrator.__main__")),
)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest prefix naming `module` (None: no layer names it)."""
    placed = [
        (len(prefix), index)
        for index, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or (prefix != "orchestrator" and module.startswith(prefix + "."))
    ]
    return max(placed)[1] if placed else None


def test_every_module_has_a_layer():
    assert sorted(name for name in MODULES if layer_of(name) is None) == []


def test_every_import_goes_down_the_layers():
    upward = sorted(
        f"{name} ({LAYERS[layer_of(name) or 0][0]}) imports {target} ({LAYERS[layer_of(target) or 0][0]})"
        for name, targets in GRAPH.items()
        for target in targets
        if (layer_of(target) or 0) > (layer_of(name) or 0)
    )
    assert upward == []


def test_the_layer_check_sees_an_upward_import():
    assert layer_of("orchestrator.job.spec") == 0 and layer_of("orchestrator.job.loading") == 1
    assert layer_of("orchestrator.commands.tables") == 4 and layer_of("orchestrator.api") == 3
    assert layer_of("orchestrator.apis.registry") == 0 and layer_of("orchestrator.apis.trainjob") == 1
    assert layer_of("orchestrator.nothing_like_it") is None


def test_the_checker_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_list_of_apis_comes_from_the_registry():
    """`api:`, `--api` (render and submit) and the API objects all say what apis/registry.py says."""
    from orchestrator import apis
    from orchestrator.commands import cluster_cmds, spec_cmds
    from orchestrator.job import spec

    assert spec.JobSpec.model_fields["api"].annotation.__args__ == apis.CHOICES
    for command in (spec_cmds.render, cluster_cmds.submit):
        option = next(p for p in command.params if p.name == "api")
        assert tuple(option.type.choices) == apis.CHOICES
    assert [api.key for api in apis.all_apis()] == list(apis.KEYS)


def test_no_module_outside_apis_names_an_api():
    """What differs between APIs lives in their modules: no other module compares against an API's key."""
    keys = "|".join(__import__("orchestrator.apis.registry").apis.registry.KEYS)
    pattern = re.compile(rf"""[=!]=\s*["']({keys})["']|["']({keys})["']\s*(in\b|[=!]=)""")
    offenders = {
        name
        for name, path in MODULES.items()
        if not name.startswith("orchestrator.apis") and pattern.search(path.read_text(encoding="utf-8"))
    }
    assert offenders == set()


def test_no_module_outside_apis_reads_an_apis_own_fields():
    """The fields of one API's objects (a PyTorchJob's replica specs, a TrainJob's runtime and child Jobs) and
    the roles of its pods are read and written by its module only: the rest asks the JobAPI (e.g.
    `pod_templates`, `display_order`)."""
    fields = {
        "Master",
        "Worker",
        "master",
        "worker",
        "node",
        "pytorchReplicaSpecs",
        "runPolicy",
        "elasticPolicy",
        "jobsStatus",
        "runtimeRef",
        "runtimePatches",
        "podGroupPolicy",
        "numNodes",
        "numProcPerNode",
    }
    offenders = {
        name
        for name, path in MODULES.items()
        # the templates' generated code writes them as the templates do, for the API module that renders them
        if not name.startswith(("orchestrator.apis", "orchestrator.rendering.precompiled"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in fields
    }
    assert offenders == set()


def test_no_module_outside_apis_imports_an_api_module():
    """Everything above apis/ reaches an API through the registry (apis.by_key, apis.all_apis): `orch doctor`'s
    checks of what an API needs included (JobAPI.setup_reads, setup_checks)."""
    from orchestrator.apis.registry import REGISTRY

    api_modules = {entry.module for entry in REGISTRY.values()}
    importers = {
        name
        for name, targets in GRAPH.items()
        if not within(name, ("orchestrator.apis",)) and targets & api_modules
    }
    assert importers == set()


def test_kubernetes_objects_as_data_stand_on_naming_alone():
    """orchestrator/kube/ (the kinds, the readers of a server's JSON) is the floor apis/, status and cluster/
    stand on: it imports nothing of orch's but naming."""
    floor = {name for name in GRAPH if within(name, ("orchestrator.kube",))}
    assert floor >= {"orchestrator.kube.kinds", "orchestrator.kube.read"}
    above = {target for name in floor for target in GRAPH[name]} - floor - {"orchestrator.naming"}
    assert above == set()


def test_rendering_stands_below_the_apis_but_for_its_entry():
    """rendering/ holds what the API modules write their objects with (parts, pod, templates, scheduling) and
    render.py, which calls the APIs: no other module of it imports apis/. Its package and the parts import
    nothing, so the spec (pod_shape) and `orch status` (tracking_record) import one module without the rest."""
    rendering = {name for name in GRAPH if within(name, ("orchestrator.rendering",))}
    assert rendering >= {"orchestrator.rendering.render", "orchestrator.rendering.pod"}
    on_apis = {name for name in rendering if any(within(t, ("orchestrator.apis",)) for t in GRAPH[name])}
    assert on_apis == {"orchestrator.rendering.render"}
    assert GRAPH["orchestrator.rendering"] == set() and GRAPH["orchestrator.rendering.parts"] == set()
