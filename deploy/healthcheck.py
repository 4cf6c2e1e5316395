#!/usr/bin/env python
"""Container health check of a Highwater service: exit 0 when it serves, 1 when not.

Healthy means both: the ready file exists (written by ServiceRuntime.mark_ready
once the service is registered in etcd, removed on a clean stop), and the
service's gRPC health check answers SERVING on the port the ready file names.
The ready file alone would call a hung process healthy; the gRPC check alone
would not know which port a `--port 0` service bound.

Installed in the image as `highwater-healthcheck` (deploy/Dockerfile). Kept to
grpc and the standard library so a probe costs ~0.1 s of CPU.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Docker's own --timeout kills a probe after 5 s; answer well before that so the
# reason is printed in `docker inspect`'s health log.
HEALTH_RPC_TIMEOUT_S = 2.0
DEFAULT_READY_FILE = "/run/highwater/ready"


def main() -> int:
    ready_path = Path(os.environ.get("HIGHWATER_READY_FILE", DEFAULT_READY_FILE))
    try:
        info = json.loads(ready_path.read_text())
    except FileNotFoundError:
        print(f"not ready: {ready_path} does not exist yet (starting, or stopping)")
        return 1
    except (OSError, ValueError) as exc:
        print(f"not ready: cannot read {ready_path}: {exc}")
        return 1
    host = str(info.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    address = f"{host}:{info['port']}"

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_RPC_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            print(f"unhealthy: gRPC health check of {address} failed: {exc.code().name}")  # type: ignore[attr-defined]
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    print(f"{address} {status}")
    return 0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
