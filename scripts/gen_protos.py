"""Generate the Python modules for protos/highwater/v1/*.proto.

The one command that produces generated code (`make protos` calls it). The
output is committed; tests/unit/test_protos_current.py fails when it is stale.
Paths are given relative to the repository root so generated modules import
each other as `protos.highwater.v1.X_pb2`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = Path("protos/highwater/v1")


def generate(out_dir: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py under out_dir; return the .proto files."""
    protos = sorted((ROOT / PROTO_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {ROOT / PROTO_DIR}")
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(ROOT)) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed; see the messages above")
    return protos


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    generate(out)


if __name__ == "__main__":
    main()
