"""The Kafka protocol listener: one asyncio server on the broker's event loop.

Per connection, a reading loop cuts frames (4-byte size, bounded by KAFKA_REQUEST_BYTES_MAX:
a larger size closes the connection before its body is read) and starts each request's
answer as a task; a writing task sends the answers in request order, as Kafka requires.
Reads are bounded in time and memory: a body must arrive within request_body_timeout_ms of its
size, and is read in pieces counted against one budget of partial-frame bytes for the whole
listener; the connection that is late or would pass the budget is closed.
Requests act in the order they came, as Kafka processes a connection's requests one at a time:
the data path's requests (protocol.PIPELINED_APIS) may overlap, since each acts in its
task's first step, so a long-polling Fetch does not hold back the Produce behind it; any other
request waits for all before it and holds back all after it. At most
KAFKA_REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX answers are in progress per connection.

A request for an API or version not served is answered UNSUPPORTED_VERSION when it is
ApiVersions (in v0, which every client reads); for any other API the connection is closed, as
Kafka does: its answer's layout is not known. Bytes that are not a Kafka request close it too.
So does an answer that cannot be encoded (a handler bug): it is logged with its API and version
and counted (KAFKA_CONNECTIONS_CLOSED "encode_failed"), so the client reconnects and retries
instead of waiting for an answer that never comes. The writing task never ends silently: any
failure in it is logged and closes the connection.

Connections are bounded per broker (connections_max) and, below that, per client address
(connections_per_ip_max, with per-address overrides, as Kafka's max.connections.per.ip), so
one client cannot take every slot; a connection over either bound is closed at accept.

With an SSL context (the broker's --tls-dir) the port is mutual TLS: the handshake, bounded by
KAFKA_TLS_HANDSHAKE_TIMEOUT_S, verifies the client's certificate against the cluster CA; the
connection's principal is "User:<CN>" as on the gRPC listeners (identity.certificate_caller), and
with ACLs (`access_for`) every request on it is answered by a handler checking that principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping

from kio.schema.errors import ErrorCode as K
from kio.schema.index import api_key_map

from services.broker import metrics
from services.common import limits
from services.kafka import protocol
from services.kafka.handler import KafkaAccess, KafkaHandler, api_versions_response
from services.kafka.listener_limits import KafkaListenerLimits
from services.security.identity import Caller, certificate_caller

log = logging.getLogger("highwater.kafka")


class _CloseConnection(Exception):
    """This connection must end (bad bytes, an unanswerable version, a handler failure)."""


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind and listen on (host, port) now, for a KafkaListener to serve later (its `sock`).

    The broker reserves its Kafka port before its gRPC server takes a free port of its own: a
    restarted broker asks for the Kafka port it had (clients keep the address Metadata gave
    them), and a gRPC port picked first could be that very port, just freed by the old process
    (seen in CI: "address already in use"). Raises OSError when the port is taken.
    """
    return socket.create_server((host, port), backlog=limits.KAFKA_LISTEN_BACKLOG)


def no_nagle(writer: asyncio.StreamWriter) -> None:
    """Turn Nagle's algorithm off on an accepted connection: every answer goes out when written.

    asyncio does this itself only for sockets made with proto IPPROTO_TCP, and the socket
    reserve_port makes (socket.create_server) has proto 0, so its connections kept Nagle on. A
    client with several requests in flight (librdkafka at linger.ms 0 keeps up to 5) then waited
    for its own delayed ACK, ~40 ms, before the next answer left: measured, 2 of 3 Produce
    round trips at 43 ms while the broker had answered in under 10 ms.
    """
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class KafkaListener:
    """Owned by the broker's event loop: start(), then close() at the broker's stop."""

    def __init__(
        self,
        handler: KafkaHandler,
        host: str,
        port: int,
        *,
        request_bytes_max: int = limits.KAFKA_REQUEST_BYTES_MAX,
        in_flight_max: int = limits.KAFKA_REQUESTS_IN_FLIGHT_PER_CONNECTION_MAX,
        connections_max: int = limits.KAFKA_CONNECTIONS_MAX,
        idle_ms_max: int = limits.KAFKA_CONNECTION_IDLE_MS_MAX,
        connections_per_ip_max: int = limits.KAFKA_CONNECTIONS_PER_IP_MAX,
        connections_per_ip_overrides: Mapping[str, int] | None = None,
        request_body_timeout_ms: int = limits.KAFKA_REQUEST_BODY_TIMEOUT_MS,
        partial_frame_bytes_max: int = limits.KAFKA_PARTIAL_FRAME_BYTES_MAX,
        ssl_context: ssl.SSLContext | None = None,
        access_for: Callable[[Caller], KafkaAccess] | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        """ssl_context: mutual TLS (client certificates required). access_for: ACLs on, the
        access of one connection's caller; it needs ssl_context (a principal to check).
        sock: a socket already listening (reserve_port) to serve instead of binding host:port.
        connections_per_ip_overrides: {client address: its bound instead of connections_per_ip_max}.
        Raises ValueError when the bounds contradict each other."""
        if access_for is not None and ssl_context is None:
            raise ValueError("Kafka listener ACLs need TLS: without it no connection has a principal")
        problem = KafkaListenerLimits(
            connections_per_ip_max,
            dict(connections_per_ip_overrides or {}),
            request_body_timeout_ms,
            partial_frame_bytes_max,
        ).problem(request_bytes_max)
        if problem is not None:
            raise ValueError(problem)
        self.handler = handler
        self.ssl_context = ssl_context
        self.access_for = access_for
        self.host = host
        self.port = port
        self.request_bytes_max = request_bytes_max
        self.in_flight_max = in_flight_max
        self.connections_max = connections_max
        self.idle_s_max = idle_ms_max / 1000
        self.connections_per_ip_max = connections_per_ip_max
        self.connections_per_ip_overrides = dict(connections_per_ip_overrides or {})
        self.request_body_timeout_s = request_body_timeout_ms / 1000
        self.partial_frame_bytes_max = partial_frame_bytes_max
        self._sock = sock
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._connections_per_ip: dict[str, int] = {}
        self._partial_frame_bytes = 0  # bodies being read, over every connection
        self._refusal_log_s = float("-inf")
        self._refusals_since_log = 0

    async def start(self) -> int:
        """Bind and listen; returns the bound port (the one asked, or a free one for 0)."""
        handshake_timeout_s = limits.KAFKA_TLS_HANDSHAKE_TIMEOUT_S if self.ssl_context else None
        if self._sock is not None:
            self._server = await asyncio.start_server(
                self._accept, sock=self._sock, ssl=self.ssl_context, ssl_handshake_timeout=handshake_timeout_s
            )
        else:
            self._server = await asyncio.start_server(
                self._accept,
                self.host,
                self.port,
                ssl=self.ssl_context,
                ssl_handshake_timeout=handshake_timeout_s,
            )
        port: int = self._server.sockets[0].getsockname()[1]
        self.port = port
        log.info(
            "Kafka protocol listener on %s:%d (%s)",
            self.host,
            port,
            "mutual TLS" + (", ACLs" if self.access_for else "") if self.ssl_context else "plaintext",
        )
        return port

    async def close(self) -> None:
        """Stop accepting, end every connection (answers in progress are dropped: clients retry)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)

    def connections_allowed(self, address: str) -> int:
        """How many connections `address` may have open at once."""
        return self.connections_per_ip_overrides.get(address, self.connections_per_ip_max)

    def _closing(self, reason: str, message: str) -> None:
        """Count a connection closed by a bound (KAFKA_CONNECTIONS_CLOSED's reason) and log it, at
        most once per KAFKA_REFUSAL_LOG_INTERVAL_S: a client reconnecting in a loop to be
        refused again cannot fill the log."""
        metrics.KAFKA_CONNECTIONS_CLOSED.labels(reason).inc()
        self._refusals_since_log += 1
        now_s = time.monotonic()
        if now_s - self._refusal_log_s >= limits.KAFKA_REFUSAL_LOG_INTERVAL_S:
            log.warning(
                "Kafka connection closed: %s (%d closed by a bound since the last such line)",
                message,
                self._refusals_since_log,
            )
            self._refusal_log_s = now_s
            self._refusals_since_log = 0

    def _refuse(self, reason: str, message: str, writer: asyncio.StreamWriter) -> None:
        """Close a connection at accept."""
        self._closing(reason, message)
        writer.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        no_nagle(writer)
        address = _address(writer.get_extra_info("peername"))
        if len(self._connections) >= self.connections_max:
            self._refuse(
                "connections_max", f"{len(self._connections)} connections already open (the bound)", writer
            )
            return
        open_here = self._connections_per_ip.get(address, 0)
        if open_here >= self.connections_allowed(address):
            self._refuse(
                "connections_per_ip_max",
                f"{address} already has {open_here} connections open, its bound "
                "(--kafka-connections-per-ip-max, --kafka-connections-per-ip-overrides)",
                writer,
            )
            return
        task = asyncio.current_task()
        if task is None:  # asyncio runs every accepted connection in a task of its own
            raise RuntimeError("Kafka connection handler runs outside a task")
        self._connections.add(task)
        self._connections_per_ip[address] = open_here + 1
        metrics.KAFKA_CONNECTIONS.inc()
        try:
            handler = self._handler_for(writer)
            if handler is not None:
                await self._serve(reader, writer, handler)
        except asyncio.CancelledError:
            # close() ends connections by cancelling them. The task ends quietly: Python 3.11's
            # stream callback asks a cancelled task for its exception and logs the CancelledError
            # it gets as an unhandled error (3.12 checks task.cancelled() first).
            pass
        finally:
            metrics.KAFKA_CONNECTIONS.dec()
            self._connections.discard(task)
            left = self._connections_per_ip[address] - 1
            if left:
                self._connections_per_ip[address] = left
            else:
                del self._connections_per_ip[address]
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _handler_for(self, writer: asyncio.StreamWriter) -> KafkaHandler | None:
        """The handler of a new connection: ACL-checking for its certificate's principal, or None
        when a TLS connection's certificate names nobody (closed)."""
        if self.ssl_context is None:
            return self.handler
        common_name = _common_name(writer.get_extra_info("peercert"))
        if not common_name:
            log.debug(
                "Kafka client %s: certificate without a common name; closing",
                writer.get_extra_info("peername"),
            )
            metrics.KAFKA_CONNECTIONS_CLOSED.labels("no_common_name").inc()
            return None
        if self.access_for is None:
            return self.handler
        return self.handler.for_connection(self.access_for(certificate_caller(common_name)))

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: KafkaHandler
    ) -> None:
        peer = writer.get_extra_info("peername")
        answers: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(self.in_flight_max)
        sender = asyncio.create_task(self._send_answers(answers, writer, peer))
        started: list[asyncio.Task[bytes | None]] = []  # answers in progress, in request order
        barrier: asyncio.Task[bytes | None] | None = None  # the latest request not pipelined
        try:
            while not sender.done():
                try:
                    try:
                        prefix = await asyncio.wait_for(reader.readexactly(4), self.idle_s_max)
                    except TimeoutError:
                        metrics.KAFKA_CONNECTIONS_CLOSED.labels("idle").inc()
                        break
                    size = protocol.frame_size(prefix)
                    if size > self.request_bytes_max:
                        metrics.KAFKA_CONNECTIONS_CLOSED.labels("request_bytes_max").inc()
                        log.warning(
                            "Kafka client %s sent a %d-byte request, over the %d-byte bound; closing",
                            peer,
                            size,
                            self.request_bytes_max,
                        )
                        break
                    body = await self._read_body(reader, size, peer)
                    if body is None:
                        break
                    frame = body
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                except protocol.KafkaProtocolError as exc:
                    log.warning("Kafka client %s: %s; closing", peer, exc)
                    metrics.KAFKA_CONNECTIONS_CLOSED.labels("unreadable").inc()
                    break
                # Kafka's order within a connection (protocol.PIPELINED_APIS says which overlap).
                pipelined = protocol.peek_api_key(frame) in protocol.PIPELINED_APIS
                started = [t for t in started if not t.done()]
                earlier = (
                    ([barrier] if barrier is not None and not barrier.done() else [])
                    if pipelined
                    else started
                )
                if earlier:
                    await asyncio.wait(earlier)
                task = asyncio.create_task(self._answer(handler, frame, peer))
                started.append(task)
                if not pipelined:
                    barrier = task
                await answers.put(task)
            # The sender consumes the queue until this end mark (closing or not), so this put
            # returns; then the answers already started go out, each bounded by its own wait.
            if not sender.done():
                await answers.put(None)
                await sender
        finally:
            sender.cancel()
            while not answers.empty():
                pending = answers.get_nowait()
                if pending is not None:
                    pending.cancel()

    async def _read_body(self, reader: asyncio.StreamReader, size: int, peer: object) -> bytes | None:
        """A frame's body of `size` bytes, or None when the connection must close: the body did not
        arrive within request_body_timeout_s, or its next piece would pass the listener's
        partial-frame budget (both counted in KAFKA_CONNECTIONS_CLOSED). Raises what readexactly
        raises at the end of the stream."""
        pieces: list[bytes] = []
        counted = 0
        try:
            async with asyncio.timeout(self.request_body_timeout_s):
                while counted < size:
                    piece = min(limits.KAFKA_FRAME_READ_CHUNK_BYTES, size - counted)
                    if self._partial_frame_bytes + piece > self.partial_frame_bytes_max:
                        self._closing(
                            "partial_frame_bytes_max",
                            f"client {peer}: its {size}-byte request would pass the "
                            f"{self.partial_frame_bytes_max} bytes of requests being read at once "
                            "(--kafka-partial-frame-bytes-max)",
                        )
                        return None
                    self._count_partial(piece)
                    counted += piece
                    pieces.append(await reader.readexactly(piece))
        except TimeoutError:
            self._closing(
                "request_body_timeout",
                f"client {peer}: the body of its {size}-byte request did not arrive within "
                f"{self.request_body_timeout_s:.1f} s (--kafka-request-body-timeout-ms)",
            )
            return None
        finally:
            self._count_partial(-counted)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _count_partial(self, delta: int) -> None:
        self._partial_frame_bytes += delta
        metrics.KAFKA_PARTIAL_FRAME_BYTES.set(self._partial_frame_bytes)

    async def _answer(self, handler: KafkaHandler, frame: bytes, peer: object) -> bytes | None:
        try:
            request = protocol.decode_request(frame)
        except protocol.UnsupportedVersion as exc:
            if exc.api_key == protocol.API_VERSIONS:
                return protocol.encode_response(
                    exc.api_key,
                    exc.correlation_id,
                    api_versions_response(protocol.API_VERSIONS_FALLBACK_VERSION, K.unsupported_version),
                )
            log.warning("Kafka client %s: %s; closing", peer, exc)
            metrics.KAFKA_CONNECTIONS_CLOSED.labels("unsupported_version").inc()
            raise _CloseConnection(str(exc)) from exc
        except protocol.KafkaProtocolError as exc:
            log.warning("Kafka client %s: %s; closing", peer, exc)
            metrics.KAFKA_CONNECTIONS_CLOSED.labels("unreadable").inc()
            raise _CloseConnection(str(exc)) from exc
        try:
            with metrics.KAFKA_REQUEST_LATENCY.labels(api_key_map[request.api_key]).time():
                response = await handler.handle(request)
        except Exception as exc:
            log.exception("Kafka request api key %d v%d failed", request.api_key, request.api_version)
            metrics.KAFKA_CONNECTIONS_CLOSED.labels("handler_failed").inc()
            raise _CloseConnection(str(exc)) from exc
        if response is None:
            return None
        try:
            return protocol.encode_response(request.api_key, request.correlation_id, response)
        except Exception as exc:
            # A handler built an answer its version cannot carry (a None where the field is not
            # nullable...): a bug, but the client must not wait for an answer that never comes.
            log.exception(
                "Kafka answer to %s (api key %d) v%d cannot be encoded; closing the connection of %s",
                api_key_map.get(request.api_key, "?"),
                request.api_key,
                request.api_version,
                peer,
            )
            metrics.KAFKA_CONNECTIONS_CLOSED.labels("encode_failed").inc()
            raise _CloseConnection(str(exc)) from exc

    @staticmethod
    async def _send_answers(
        answers: asyncio.Queue[asyncio.Task[bytes | None] | None], writer: asyncio.StreamWriter, peer: object
    ) -> None:
        closed = False
        while True:
            task = await answers.get()
            if task is None:
                return
            if closed:
                # Nothing more goes out; keep taking from the queue so the reader never blocks on it.
                task.cancel()
                continue
            try:
                frame = await task
                if frame is not None:
                    writer.write(frame)
                    await writer.drain()
            except (_CloseConnection, ConnectionError):
                writer.close()  # the reader then meets the end of the stream
                closed = True
            except Exception:
                # Anything else is a bug; the connection still ends, and says why, rather than
                # leave its client waiting with this task gone.
                log.exception("Kafka connection of %s: sending an answer failed; closing", peer)
                metrics.KAFKA_CONNECTIONS_CLOSED.labels("send_failed").inc()
                writer.close()
                closed = True


def _address(peername: object) -> str:
    """The client address of a connection's peername ((host, port) or IPv6's 4-tuple)."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return str(peername)


def _common_name(peercert: object) -> str:
    """The subject common name of a verified peer certificate, as ssl.SSLObject.getpeercert
    gives it (a tuple of RDNs, each a tuple of (name, value) pairs); "" when it has none."""
    if not isinstance(peercert, dict):
        return ""
    for rdn in peercert.get("subject", ()):
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return ""
