"""RocketMQ 5's message types (``apache.rocketmq.v2``), built from Apache's published wheel on
first use (``proxy.protocol_build``); a clear error when they cannot be."""

from __future__ import annotations

from proxy.protocol_build import ProtocolBuildError, build

try:
    build()
except ProtocolBuildError as exc:
    raise ProtocolBuildError(
        f"RocketMQ 5 message types are missing and could not be built: {exc}. "
        "Run 'python -m proxy.protocol_build' where PyPI is reachable."
    ) from None

from proxy._pb import definition_pb2 as pb  # noqa: E402
from proxy._pb import service_pb2 as spb  # noqa: E402
from proxy._pb import service_pb2_grpc as sgrpc  # noqa: E402

Code = pb.Code
__all__ = ["Code", "pb", "sgrpc", "spb"]
