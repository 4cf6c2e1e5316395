"""The settings every service takes have one home (services/common/service_config.py), and the
gateway keeps the size rules of issue 40 (no class over 600 lines, no function over 120)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from services.broker.server import BrokerConfig
from services.cli import CommonOptions
from services.common.service_config import ServiceConfig
from services.controller.server import ControllerConfig
from services.gateway.server import GatewayConfig
from tests.python_source import parse_python

CONFIGS = [BrokerConfig, ControllerConfig, GatewayConfig]
GATEWAY = Path(__file__).resolve().parents[2] / "services" / "gateway"
CLASS_LINES_MAX = 600
FUNCTION_LINES_MAX = 120


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_service_config_takes_the_common_settings_from_the_one_base(config: type) -> None:
    assert issubclass(config, ServiceConfig)
    common = _names(ServiceConfig)
    for own in inspect.get_annotations(config):
        assert own not in common, f"{config.__name__} declares {own} again"


def test_the_common_flags_fill_exactly_the_common_settings_but_security() -> None:
    """services/cli.py builds every config from `config_fields()` plus `security`."""
    common = CommonOptions(
        etcd="127.0.0.1:2379",
        etcd_prefix="/highwater",
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        lease_ttl_s=10,
        ready_file=None,
        log_level="INFO",
        json_logs=False,
    )
    assert set(common.config_fields()) == _names(ServiceConfig) - {"security"}


def test_defaults_are_the_ones_each_service_had() -> None:
    gateway = GatewayConfig(gateway_id=1, etcd_endpoints=["127.0.0.1:2379"])
    controller = ControllerConfig(controller_id=1, etcd_endpoints=["127.0.0.1:2379"])
    broker = BrokerConfig(broker_id=1, data_dir=Path("/tmp/unused"), etcd_endpoints=["127.0.0.1:2379"])
    for config in (gateway, controller, broker):
        assert (config.host, config.port, config.metrics_port, config.etcd_prefix, config.ready_file) == (
            "127.0.0.1",
            0,
            0,
            "/highwater",
            None,
        )
    assert controller.delete_topic_enable and broker.rack == ""


def _too_long(path: Path) -> list[str]:
    found = []
    for node in ast.walk(parse_python(path.read_text())):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = CLASS_LINES_MAX if isinstance(node, ast.ClassDef) else FUNCTION_LINES_MAX
            if lines > limit:
                found.append(f"{path.name}:{node.lineno} {node.name} has {lines} lines (limit {limit})")
    return found


def test_no_gateway_class_or_function_is_over_the_size_limits() -> None:
    found = [problem for path in sorted(GATEWAY.glob("*.py")) for problem in _too_long(path)]
    assert not found, found
