"""The PrometheusRule: valid against the operator's CRD, `promtool check rules`, `promtool test rules`."""

from __future__ import annotations

import copy
import shutil
import subprocess

import jsonschema
import pytest
import yaml

from tests.conftest import require_tool
from tests.metrics.conftest import MONITORING, REPO, rule_groups

CRD = REPO.parent / "shared" / "schemas" / "prometheusrules.monitoring.coreos.com.yaml"


def to_jsonschema(node, strict=True):
    """CRD structural schema -> JSON Schema; strict: unknown fields are errors (like kubectl --validate=strict)."""
    if isinstance(node, list):
        return [to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: to_jsonschema(v, strict)
        for k, v in node.items()
        if not k.startswith("x-kubernetes-") and k not in ("description", "nullable")
    }
    if node.get("x-kubernetes-int-or-string"):
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
        out.pop("type", None)
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        strict
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def validator():
    if not CRD.exists():
        pytest.fail(f"{CRD} is missing (the shared CRD schemas live next to the repository)")
    crd = yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = to_jsonschema(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)


def _errors(validator, obj):
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]


def test_prometheusrule_matches_the_crd(validator):
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert _errors(validator, rule) == []
    broken = copy.deepcopy(rule)  # the validator does catch mistakes
    broken["spec"]["groups"][0]["rules"][0]["fro"] = "5m"
    assert _errors(validator, broken)


def test_expected_alerts():
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    assert alerts == {
        "OrchGpuIdle",
        "OrchTrainingStalled",
        "OrchNonFiniteLoss",
        "OrchAmpSkippedSteps",
        "OrchGpuMemoryNearlyFull",
        "OrchInputBound",
    }


def test_promtool_check_and_unit_tests(tmp_path):
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule_groups()))
    shutil.copy(REPO / "tests" / "metrics" / "rules_test.yml", tmp_path / "rules_test.yml")
    check = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run(
        [promtool, "test", "rules", str(tmp_path / "rules_test.yml")], capture_output=True, text=True
    )
    assert test.returncode == 0, test.stdout + test.stderr
