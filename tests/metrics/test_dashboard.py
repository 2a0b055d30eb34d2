"""The Grafana dashboard: JSON and ConfigMap in sync, variables, queries that parse, docs that cover them."""

from __future__ import annotations

import json
import re

import promql_parser
import pytest
import yaml

from tests.metrics.conftest import MONITORING, REPO, concrete, dashboard, panel_queries

# What issue 5 asks the dashboard to show, by panel title.
REQUIRED_PANELS = [
    "GPU utilization",
    "GPU memory used",
    "GPU power",
    "GPU temperature",
    "GPU throttling",
    "Samples/s",
    "Tokens/s",
    "Loss",
    "Learning rate",
    "Gradient norm",
    "Step time p50 / p95",
    "Data-wait share",
    "MFU",
    "AMP loss scale",
    "AMP skipped steps",
    "Restarts",
    "Goodput",  # issue 31
    "Badput by cause",
]
# The job's series, which rank 0 alone writes: selected by rank="0", not by the rank variable.
JOB_PANELS = ("Restarts", "Goodput", "Badput by cause")


def test_configmap_holds_exactly_the_dashboard_json():
    configmap = yaml.safe_load((MONITORING / "dashboard-configmap.yaml").read_text())
    assert configmap["apiVersion"] == "v1" and configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"  # a string: label values are strings
    ((key, text),) = configmap["data"].items()
    assert key.endswith(".json")
    assert json.loads(text) == dashboard()


def test_variables_and_datasource():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "job", "rank", "gpu"}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("namespace", "job", "rank", "gpu"):
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        promql_parser.parse(
            concrete(re.sub(r"^label_values\((.*), \w+\)$", r"\1", variables[name]["query"]["query"]))
        )
    for panel in dashboard()["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel[
                "title"
            ]  # no hard-coded datasource uid


def test_required_panels_exist_and_ids_are_unique():
    panels = dashboard()["panels"]
    titles = [p["title"] for p in panels]
    assert not [t for t in REQUIRED_PANELS if t not in titles]
    assert len({p["id"] for p in panels}) == len(panels)


@pytest.mark.parametrize(("row", "title", "expr"), panel_queries())
def test_panel_query_parses_and_uses_the_variables(row, title, expr):
    promql_parser.parse(concrete(expr))
    assert 'namespace=~"$namespace"' in expr and 'job=~"$job"' in expr
    if "orch_gpu_" in expr:
        assert 'gpu_uuid=~"$gpu"' in expr
    elif title not in JOB_PANELS:
        assert 'rank=~"$rank"' in expr


def test_every_metric_on_the_dashboard_and_in_the_rules_is_documented():
    docs = (REPO / "docs" / "metrics.md").read_text()
    rules = (MONITORING / "prometheusrule.yaml").read_text()
    used = set(re.findall(r"\borch_[a-z_]+", " ".join(e for _, _, e in panel_queries()) + rules))
    documented = set(re.findall(r"^\| `(orch_[a-z_]+)`", docs, re.MULTILINE))
    base = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    assert base - documented == set()
