"""Generate the Python modules for protos/highwater/v1/*.proto.

The one command that produces generated code (`make protos` calls it). The
output is committed; tests/unit/test_protos_current.py fails when it is stale.

The .proto files import each other as "highwater/v1/common.proto", so any
language's protoc runs with `-I protos` (docs/GRPC.md). protoc therefore makes
Python modules that import `highwater.v1.X_pb2`; our code imports them as
`protos.highwater.v1.X_pb2`, so this script rewrites those import lines (and
nothing else) after protoc has run. The descriptors keep the file names
"highwater/v1/X.proto", which is what reflection serves to other tools.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = Path("protos")
PACKAGE_DIR = Path("highwater/v1")
# `from highwater.v1 import common_pb2 as ...` in *_pb2.py, *_pb2_grpc.py and *_pb2.pyi.
_IMPORT = re.compile(r"^from highwater\.v1 import ", re.MULTILINE)


def generate(out_dir: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py under out_dir/protos/highwater/v1;
    return the .proto files.
    """
    protos = sorted((ROOT / PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {ROOT / PROTO_ROOT / PACKAGE_DIR}")
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as raw_dir:
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT / PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={raw_dir}",
            f"--pyi_out={raw_dir}",
            f"--grpc_python_out={raw_dir}",
            *[str(p.relative_to(ROOT / PROTO_ROOT)) for p in protos],
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed; see the messages above")
        target = out_dir / PROTO_ROOT / PACKAGE_DIR
        target.mkdir(parents=True, exist_ok=True)
        for made in sorted((Path(raw_dir) / PACKAGE_DIR).iterdir()):
            text = _IMPORT.sub("from protos.highwater.v1 import ", made.read_text())
            (target / made.name).write_text(text)
    return protos


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    generate(out)


if __name__ == "__main__":
    main()
