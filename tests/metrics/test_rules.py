"""The PrometheusRule: valid against the operator's CRD, `promtool check rules`, `promtool test rules`."""

from __future__ import annotations

import copy
import shutil
import subprocess

import yaml

from tests.conftest import require_tool
from tests.metrics.conftest import MONITORING, REPO, rule_groups
from tests.spec.manifest_checks import schema_errors


def test_prometheusrule_matches_the_crd():
    rule = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert schema_errors(rule) == []
    broken = copy.deepcopy(rule)  # the validator does catch mistakes
    broken["spec"]["groups"][0]["rules"][0]["fro"] = "5m"
    assert schema_errors(broken)


def test_expected_alerts():
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    assert alerts == {
        "OrchGpuIdle",
        "OrchTrainingStalled",
        "OrchStraggler",
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
