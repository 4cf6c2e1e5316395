"""Generated protobuf code is produced by one command and never edited by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED_DIR = ROOT / "protos" / "highwater" / "v1"


def _load_generator():
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_modules_match_the_proto_files(tmp_path):
    protos = _load_generator().generate(tmp_path)
    fresh = sorted(
        p for p in (tmp_path / "protos" / "highwater" / "v1").iterdir() if p.suffix in (".py", ".pyi")
    )
    assert len(fresh) == 3 * len(protos)
    stale = [p.name for p in fresh if (GENERATED_DIR / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"generated code is stale for {stale}: run `make protos` and commit the result"


def test_no_generated_module_without_its_proto():
    protos = {p.stem for p in GENERATED_DIR.glob("*.proto")}
    generated = {p.name.split("_pb2")[0] for p in GENERATED_DIR.glob("*_pb2*.py")}
    assert generated == protos
