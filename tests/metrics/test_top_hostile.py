"""`orch top` against a Prometheus that answers what a hostile or broken one would (issue #33): NaN and
infinite values (Prometheus' API writes them as strings, and a diverged run's loss is one), a count that is not
a count, rank labels that are digits to str.isdigit but no int, JSON nested past the parser's stack, an endless
or trickling answer. Each ends in a table, valid JSON, or one error line (exit 1). The server is a real HTTP
server on 127.0.0.1 (tests/fakes/scripted.py); `orch top` runs in this process as the console script does."""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs, urlsplit

import pytest

from orchestrator import top
from tests.cluster.test_faults import one_error_line
from tests.cluster.test_transport_faults import endless, trickle
from tests.fakes.cli import run_orch
from tests.fakes.scripted import Request, scripted


def vector(*samples: tuple[dict[str, str], str]) -> dict:
    result = [{"metric": metric, "value": [time.time(), value]} for metric, value in samples]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def prometheus(answer):  # type: ignore[no-untyped-def]
    """A Prometheus whose instant query `expr` is answered `answer(expr)` (a vector)."""

    def script(request: Request) -> None:
        expr = parse_qs(urlsplit(request.seen.path).query).get("query", [""])[0]
        request.answer(200, vector(*answer(expr)))

    return script


def orch_top(url: str, *args: str):  # type: ignore[no-untyped-def]
    return run_orch("top", "j", "--prometheus", url, "--once", *args, env={"ORCH_PROMETHEUS_URL": None})


def strict_json(text: str):  # type: ignore[no-untyped-def]
    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def not_numbers(expr: str) -> list[tuple[dict[str, str], str]]:
    """Every series of two ranks; rank 1's values NaN and infinities, and the count NaN."""
    if expr.startswith("count("):
        return [({}, "NaN")]
    if "(" in expr.split("{")[0]:  # another aggregation: +Inf
        return [({}, "+Inf")]
    ranks = [({"job": "j", "rank": "0", "gpu_uuid": "GPU-0"}, "1.5"), ({"job": "j", "rank": "1"}, "NaN")]
    if expr.startswith("orch_train_loss"):
        ranks[1] = ({"job": "j", "rank": "1"}, "-Inf")
    return ranks


def test_nan_and_infinite_values_print_and_are_valid_json():
    """Before: the count's NaN reached int() (a traceback), and `-o json` printed a bare NaN, which no strict
    JSON parser (jq) reads."""
    with scripted(prometheus(not_numbers)) as server:
        table = orch_top(server.url)
        as_json = orch_top(server.url, "-o", "json")
    assert table.returncode == 0, table.stderr
    assert as_json.returncode == 0, as_json.stderr
    answer = strict_json(as_json.stdout)
    assert answer["summary"]["ranks"] == 0  # NaN is no count
    assert answer["summary"]["step"] == "+Inf"
    assert [(row["rank"], row["loss"], row["step"]) for row in answer["rows"]] == [
        (0, 1.5, 1.5),
        (1, "-Inf", "NaN"),
    ]


@pytest.mark.parametrize(
    "rank",
    ["²", "1" * 5000, "-1", " 3", "٣"],
    ids=["superscript", "5000-digits", "negative", "space", "arabic"],
)
def test_rank_labels_that_are_no_number(rank):
    """Before: "²" and a 5000-digit label passed str.isdigit and then failed int() (a traceback)."""

    def answer(expr: str) -> list[tuple[dict[str, str], str]]:
        return (
            []
            if "(" in expr.split("{")[0]
            else [({"job": "j", "rank": rank}, "7"), ({"job": "j", "rank": "0"}, "1")]
        )

    with scripted(prometheus(answer)) as server:
        result = orch_top(server.url, "-o", "json")
    assert result.returncode == 0, result.stderr
    assert [row["rank"] for row in strict_json(result.stdout)["rows"]] == [0, None]


def test_json_nested_past_the_parsers_stack_is_one_error_line():
    """Before: RecursionError (a traceback)."""
    with scripted(lambda request: request.answer(200, b"[" * 100_000)) as server:
        result = orch_top(server.url)
    assert result.returncode == 1
    assert one_error_line(result.stderr).startswith(
        f"error: {server.url} is not a Prometheus API (its answer is not JSON"
    )


def test_an_endless_answer_is_cut_at_its_bound(monkeypatch):
    """Before: read whole into memory. The bound (64 MiB) is lowered so the test moves 1 MiB."""
    monkeypatch.setattr(top, "MAX_ANSWER_BYTES", 2**20)
    with scripted(endless) as server:
        result = orch_top(server.url)
    assert result.returncode == 1
    assert one_error_line(result.stderr) == (
        f"error: {server.url}/api/v1/query: its answer is larger than 1 MiB, more than a Prometheus or an "
        "exporter sends for one job"
    )


def test_a_trickling_answer_ends_at_the_timeout():
    """Before: urllib's timeout is per socket read, so a byte every 0.1 s held `orch top` for ever."""
    with scripted(trickle) as server:
        started = time.monotonic()
        with pytest.raises(top.TopError, match=r"/metrics: its answer was still arriving after 1s$"):
            top._get(f"{server.url}/metrics", 1.0)
    assert time.monotonic() - started < 30  # far above the 1 s it takes; before, it never ended
