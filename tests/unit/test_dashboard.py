"""The Grafana dashboard queries only metrics the services export, under their exported names.

prometheus_client renames on export: a Counter `x` is scraped as `x_total`
(and `x_created`), a Histogram `x` as `x_bucket`, `x_sum`, `x_count`. A panel
that queries the Python-side name shows "No data" forever, and nothing else
would notice; this test does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "highwater.json"
DATASOURCE = REPO_ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
METRIC_NAME = re.compile(r"\bhighwater_[A-Za-z0-9_]+")

# Sample-name suffixes prometheus_client adds for each metric type.
SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "unknown": ("",),
}

# What the issue asks the dashboard to show, by exported name.
REQUIRED = {
    "highwater_under_replicated_partitions",
    "highwater_offline_partitions_count",
    "highwater_active_controller_count",
    "highwater_leader_count",
    "highwater_partition_count",
    "highwater_isr_shrinks_total",
    "highwater_isr_expands_total",
    "highwater_request_latency_seconds_bucket",
    "highwater_gateway_request_latency_seconds_bucket",
    "highwater_bytes_in_total",
    "highwater_bytes_out_total",
    "highwater_replica_fetcher_max_lag",
    "highwater_lease_keepalive_failures",
    "highwater_controller_event_queue_time_seconds_bucket",
}


def _families() -> list[Metric]:
    import services.broker.metrics
    import services.controller.metrics
    import services.gateway.metrics  # noqa: F401  (registering the metrics is the point)

    return [f for f in REGISTRY.collect() if f.name.startswith("highwater_")]


def exported_names() -> set[str]:
    """Every sample name the three services' metrics can produce, children or not."""
    names: set[str] = set()
    for family in _families():
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(s.name for s in family.samples)
    return names


def cumulative_names() -> set[str]:
    """Sample names that only ever grow: counters' _total, histograms' _bucket, _sum, _count."""
    names: set[str] = set()
    for family in _families():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type in ("histogram", "summary"):
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows' nested panels included."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (p.get("title", "?"), t["expr"]) for p in _panels(dashboard["panels"]) for t in p.get("targets", [])
    ]


def test_the_services_export_metrics_at_all() -> None:
    # Guards the test below against an empty registry passing vacuously.
    assert "highwater_under_replicated_partitions" in exported_names()
    assert "highwater_isr_shrinks_total" in exported_names()
    assert "highwater_isr_shrinks" not in exported_names()


@pytest.mark.parametrize(("title", "expr"), queries(), ids=[f"{t}:{i}" for i, (t, _) in enumerate(queries())])
def test_every_panel_query_names_an_exported_metric(title: str, expr: str) -> None:
    used = set(METRIC_NAME.findall(expr))
    assert used, f"panel {title!r} queries no highwater_ metric: {expr}"
    unknown = used - exported_names()
    assert not unknown, f"panel {title!r} queries {sorted(unknown)}, which no service exports"


@pytest.mark.parametrize(("title", "expr"), queries(), ids=[f"{t}:{i}" for i, (t, _) in enumerate(queries())])
def test_counters_and_histograms_are_only_read_as_rates(title: str, expr: str) -> None:
    # A raw counter or bucket plotted as is climbs forever and says nothing.
    # (By type, not by suffix: gauges such as highwater_leader_count end in _count too.)
    for m in METRIC_NAME.finditer(expr):
        if m.group() in cumulative_names():
            before = expr[: m.start()].rstrip()
            assert before.endswith(("rate(", "increase(")), (
                f"panel {title!r} uses {m.group()} outside rate()/increase(): {expr}"
            )


def test_the_dashboard_shows_everything_the_issue_asks_for() -> None:
    used = {name for _, expr in queries() for name in METRIC_NAME.findall(expr)}
    assert not REQUIRED - used, f"no panel shows {sorted(REQUIRED - used)}"


def test_panels_use_the_provisioned_datasource() -> None:
    uid = re.search(r"^\s*uid:\s*(\S+)", DATASOURCE.read_text(), flags=re.M)
    assert uid is not None
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid.group(1), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == uid.group(1), panel["title"]
