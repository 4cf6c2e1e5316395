"""The grpc.aio server interceptor that authenticates, authorizes and limits every request.

Installed on a service's server only when a security flag is on (runtime.py);
without flags no interceptor exists and requests take exactly the old path.
For each method the handler is wrapped once (and the wrapper cached), so
the per-request cost is the wrapper itself: read the auth context, run the
method's rule (rules.py), charge quotas.

Order per request:
1. Health checks pass untouched.
2. Authenticate (TLS on): a bearer token (`authorization: Bearer hwt...`) wins,
   else the client certificate's common name; neither is UNAUTHENTICATED.
   A principal forwarded by a gateway (`x-highwater-principal-bin`) is taken
   only from a gateway certificate; from anyone else it is PERMISSION_DENIED.
3. The method's rule: PERMISSION_DENIED for the whole request, or an answer
   made without the servicer, or a narrowed request plus a response fix-up.
4. Quotas (direct clients only; forwarded requests were charged by the
   gateway): a request from a principal still inside its throttle window waits
   it out first; the response carries throttle_time_ms for the bytes moved.
5. The servicer runs with the caller in CURRENT_CALLER, which the gateway's
   client interceptor (`ForwardPrincipal`) reads to pass the principal on.

A stream that carries a unary method's calls (rules.UNARY_OVER_STREAM: FetchStream)
is authenticated once and then takes steps 3-5, with a connection slot and a
bearer token's re-check, for every message, as that unary call would. Any other
stream of requests (BrokerHeartbeat, StandbyHeartbeat) is authenticated once and
takes step 3, with a bearer token's re-check, for every message: the first before
its servicer starts, so a refused stream never reaches it.

Every refusal is counted in metrics and logged at DEBUG (an attacker must not
be able to fill the disk with log lines).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, Protocol

import grpc
import prometheus_client

from services.common.interceptors import WrappingInterceptor, as_async_iter, maybe_await
from services.common.limits import STREAM_TOKEN_RECHECK_S, WAITING_PER_SLOT_MAX
from services.common.stream_ends import STREAM_ENDS
from services.security import rules, tokens
from services.security.authz import Authorizer, check_principal
from services.security.identity import ANONYMOUS_CALLER, Caller, certificate_caller
from services.security.quotas import QuotaKind, QuotaManager

log = logging.getLogger("highwater.security")

# The gateway passes its client's principal to brokers and the controller in this
# binary metadata entry (UTF-8). Trusted only from a gateway's certificate.
FORWARDED_PRINCIPAL_KEY = "x-highwater-principal-bin"
AUTHORIZATION_KEY = "authorization"
# The part of a request's deadline a quota delay may use: the rest is left for the work.
QUOTA_DELAY_DEADLINE_SHARE = 0.5

CURRENT_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "highwater_caller", default=None
)

REFUSED = prometheus_client.Counter(
    "highwater_security_refused_requests_total",
    "Requests refused whole by the security layer",
    ["method", "reason"],
)
PARTITIONS_REFUSED = prometheus_client.Counter(
    "highwater_security_refused_partitions_total",
    "Topics or partitions answered with an authorization error",
    ["method"],
)
THROTTLE_MS = prometheus_client.Counter(
    "highwater_quota_throttle_time_ms_total", "throttle_time_ms handed out, by quota", ["quota"]
)


class TokenVerifier(Protocol):
    """What the interceptor needs from the security cache (cache.py)."""

    authorizer: Authorizer

    def verify_token(self, token: str, now_ms: int) -> str | None: ...


class _Connection:
    __slots__ = ("in_flight", "waiters")

    def __init__(self) -> None:
        self.in_flight = 0
        self.waiters: deque[asyncio.Future[None]] = deque()


class ConnectionLimiter:
    """At most `in_flight_max` requests in progress per client connection (gRPC peer address).

    Extra requests wait in arrival order for a slot, bounded by their deadline and by
    WAITING_PER_SLOT_MAX per slot; beyond that they are refused. Kafka gets the same
    effect by reading one request per connection at a time. (gRPC's HTTP/2
    max_concurrent_streams setting would be the transport's way, but its server
    answers streams over the limit with RST_STREAM REFUSED_STREAM, which clients
    see as UNAVAILABLE.) Owned by the service's event loop; no locks.
    """

    def __init__(self, in_flight_max: int) -> None:
        if in_flight_max < 1:
            raise ValueError(f"in_flight_max must be >= 1, got {in_flight_max}")
        self.in_flight_max = in_flight_max
        self.waiting_max = in_flight_max * WAITING_PER_SLOT_MAX
        self._connections: dict[str, _Connection] = {}

    async def acquire(self, peer: str) -> bool:
        """Take a slot (waiting for one if needed); False when too many already wait."""
        conn = self._connections.get(peer)
        if conn is None:
            conn = self._connections[peer] = _Connection()
        if conn.in_flight < self.in_flight_max and not conn.waiters:
            conn.in_flight += 1
            return True
        if len(conn.waiters) >= self.waiting_max:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.waiters.append(fut)
        try:
            await fut  # release() hands its slot over: in_flight stays counted
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(peer)  # the slot arrived as we were cancelled: pass it on
            elif fut in conn.waiters:
                conn.waiters.remove(fut)
            raise
        return True

    def release(self, peer: str) -> None:
        conn = self._connections[peer]
        while conn.waiters:
            fut = conn.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        conn.in_flight -= 1
        if conn.in_flight == 0:
            del self._connections[peer]


class SecurityInterceptor(WrappingInterceptor):
    """Authentication, per-RPC rules and quotas for one service's server (owned by its event loop)."""

    def __init__(
        self,
        *,
        tls: bool,
        cache: TokenVerifier | None,
        acl: bool,
        limits: rules.Limits,
        quotas: QuotaManager | None,
        connections: ConnectionLimiter | None = None,
    ) -> None:
        super().__init__()
        self.tls = tls
        self.cache = cache
        self.acl = acl
        self.limits = limits
        self.quotas = quotas
        self.connections = connections

    # ---- wrapping ---------------------------------------------------------------------------

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if method in rules.UNAUTHENTICATED_METHODS:
            return handler
        rule = rules.rule_for(method)
        # Requests, streamed ones too, arrive as bytes and are parsed here, after authentication:
        # an unauthenticated caller costs no parsing, and a malformed request is answered
        # INVALID_ARGUMENT (gRPC itself would say UNKNOWN, as if a handler had failed).
        raw = {"request_deserializer": None, "response_serializer": handler.response_serializer}
        parse = handler.request_deserializer
        unary_method = rules.UNARY_OVER_STREAM.get(method)
        if unary_method is not None and handler.stream_stream is not None:
            # Each message is parsed here too, after authentication, as a unary request is.
            return grpc.stream_stream_rpc_method_handler(
                self._unary_over_stream(method, unary_method, rule, handler.stream_stream, parse), **raw
            )
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, rule, handler.unary_unary, parse), **raw
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(method, rule, handler.unary_stream, parse), **raw
            )
        # Any other stream of requests: each message is parsed and checked here (_checked_requests).
        if handler.stream_unary is not None:
            inner_su = handler.stream_unary

            async def stream_unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                caller, requests = await self._checked_requests(
                    method, rule, request_iterator, context, parse
                )
                token = CURRENT_CALLER.set(caller)
                try:
                    return await maybe_await(inner_su(requests, context))
                finally:
                    CURRENT_CALLER.reset(token)

            return grpc.stream_unary_rpc_method_handler(stream_unary, **raw)
        inner_ss = handler.stream_stream

        async def stream_stream(
            request_iterator: Any, context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Any]:
            caller, requests = await self._checked_requests(method, rule, request_iterator, context, parse)
            CURRENT_CALLER.set(caller)  # this generator runs in the RPC's own task: nothing leaks
            async for item in as_async_iter(inner_ss(requests, context)):
                yield item

        return grpc.stream_stream_rpc_method_handler(stream_stream, **raw)

    async def _checked_requests(
        self,
        method: str,
        rule: rules.Rule | None,
        request_iterator: Any,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
    ) -> tuple[Caller, AsyncIterator[Any]]:
        """The caller of a stream of requests (client-streaming or bidirectional, not
        UNARY_OVER_STREAM) and the requests its servicer reads, each admitted by the method's rule.

        The rule reads the request, so it cannot run when the stream opens: it runs on every
        message, as on a unary request of the method. The first message is read and checked here,
        before the servicer runs: a refused stream ends PERMISSION_DENIED (or INVALID_ARGUMENT
        when it does not parse) and its servicer never starts, so nothing it would do on a forged
        first message happens (a BrokerHeartbeat counting a dead broker as connected). Each later
        message is checked as the servicer reads it; a refused one aborts the call, and the
        servicer's read raises as if the servicer had aborted it. A bearer token is checked again
        before every message and while the stream idles (`_while_token_valid`).
        """
        caller = await self._authenticate(method, context)
        messages: AsyncIterator[Any] = aiter(request_iterator)
        if caller.authenticated_by == "token":
            messages = self._while_token_valid(method, messages, _bearer_token(context), context)
        first = await anext(messages, None)
        if first is None:
            return caller, _no_requests()
        request = await self._check_whole(method, rule, caller, first, context, parse)

        async def checked() -> AsyncIterator[Any]:
            yield request
            async for raw in messages:
                yield await self._check_whole(method, rule, caller, raw, context, parse)

        return caller, checked()

    async def _check_whole(
        self,
        method: str,
        rule: rules.Rule | None,
        caller: Caller,
        raw: Any,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
    ) -> Any:
        """One message of a stream of requests, parsed and admitted whole; aborts on refusal."""
        request, admission = await self._check(method, rule, caller, raw, context, parse)
        if admission.request is not request or admission.answer is not None or admission.respond is not None:
            # Only a unary call (or UNARY_OVER_STREAM message) has an answer to carry a partial refusal.
            raise RuntimeError(
                f"{method}: the rule narrowed or answered a message of a client stream; "
                "a stream's rule may only admit or refuse each message whole"
            )
        return request

    def _unary(
        self,
        method: str,
        rule: rules.Rule | None,
        inner: Callable[..., Any],
        parse: Callable[[bytes], Any] | None,
    ) -> Callable[..., Any]:
        produce = method in rules.PRODUCE_METHODS
        fetch = method in rules.FETCH_METHODS

        async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
            connections = self.connections
            if connections is None:
                return await admitted(request, context)
            peer = await self._take_slot(connections, method, context)
            try:
                return await admitted(request, context)
            finally:
                connections.release(peer)

        async def admitted(raw: Any, context: grpc.aio.ServicerContext) -> Any:
            caller = await self._authenticate(method, context)

            async def serve(request: Any) -> Any:
                token = CURRENT_CALLER.set(caller)
                try:
                    return await maybe_await(inner(request, context))
                finally:
                    CURRENT_CALLER.reset(token)

            return await self._serve_request(
                method, rule, caller, raw, context, parse, serve, produce=produce, fetch=fetch
            )

        return behavior

    async def _serve_request(
        self,
        method: str,
        rule: rules.Rule | None,
        caller: Caller,
        raw: Any,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
        serve: Callable[[Any], Awaitable[Any]],
        *,
        produce: bool,
        fetch: bool,
    ) -> Any:
        """One unary request of an authenticated caller: parse, rule, quotas, `serve` (the servicer)
        on what the rule admitted, the rule's fix-up of the answer. Aborts the RPC on refusal."""
        request, admission = await self._check(method, rule, caller, raw, context, parse)
        # Quotas charge direct clients only: forwarded requests were charged by the gateway.
        quotas = self.quotas if caller.service is None and caller.forwarded_by is None else None
        charged = produce or (fetch and request.replica_id < 0)
        if quotas is not None and charged:
            await self._wait_out_throttle(
                quotas, caller, QuotaKind.PRODUCE if produce else QuotaKind.FETCH, context
            )
        if admission.answer is not None:
            response = admission.answer
        else:
            response = await serve(admission.request)
            if admission.respond is not None and response is not None:
                response = admission.respond(response)
        if quotas is not None and response is not None and charged:
            kind = QuotaKind.PRODUCE if produce else QuotaKind.FETCH
            moved = admission.request.ByteSize() if produce else response.ByteSize()
            throttle_ms = quotas.record(caller.principal, kind, moved, _now_ms())
            if throttle_ms:
                THROTTLE_MS.labels(kind.value).inc(throttle_ms)
                response.throttle_time_ms = max(response.throttle_time_ms, throttle_ms)
        return response

    def _unary_over_stream(
        self,
        method: str,
        unary_method: str,
        rule: rules.Rule | None,
        inner: Callable[..., Any],
        parse: Callable[[bytes], Any] | None,
    ) -> Callable[..., AsyncIterator[Any]]:
        """A stream carrying `unary_method`'s calls (rules.UNARY_OVER_STREAM): each message is
        admitted exactly as a call of that method would be, in order, one at a time.

        The caller is authenticated once, when the stream opens (its certificate and metadata do
        not change); a bearer token is checked again before every message and while the stream
        idles (`_while_token_valid`). Per message: a connection slot, the parse, the rule, the
        quotas and the rule's fix-up of the answer, as in `_unary`. A refusal of the whole
        request ends the stream with the status the unary call would have got. The servicer
        reads the admitted (possibly narrowed) requests from a one-slot feed and must answer
        each before it reads the next; a request the rule answered itself never reaches it.
        """
        produce = unary_method in rules.PRODUCE_METHODS
        fetch = unary_method in rules.FETCH_METHODS

        async def behavior(request_iterator: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            caller = await self._authenticate(method, context)
            requests: AsyncIterator[Any] = aiter(request_iterator)
            if caller.authenticated_by == "token":
                requests = self._while_token_valid(method, requests, _bearer_token(context), context)
            feed = _OneRequestFeed(method)
            CURRENT_CALLER.set(caller)  # this generator runs in the RPC's own task: nothing leaks
            produced = inner(feed, context)
            answers: AsyncIterator[Any] = (
                produced if hasattr(produced, "__anext__") else as_async_iter(produced)
            )

            async def serve(request: Any) -> Any:
                feed.put(request)
                try:
                    return await anext(answers)
                except StopAsyncIteration:
                    raise RuntimeError(f"{method}: the servicer ended the stream without an answer") from None

            async def one(raw: Any) -> Any:
                return await self._serve_request(
                    method, rule, caller, raw, context, parse, serve, produce=produce, fetch=fetch
                )

            try:
                while True:
                    # The caller's next message, or the end of a stream the service ended.
                    try:
                        raw = await STREAM_ENDS.next_message(requests, context)
                    except StopAsyncIteration:
                        return
                    connections = self.connections
                    if connections is None:
                        yield await one(raw)
                        continue
                    # A slot per message, as per unary call: an idle stream holds none.
                    peer = await self._take_slot(connections, method, context)
                    try:
                        response = await one(raw)
                    finally:
                        connections.release(peer)
                    yield response
            finally:
                close = getattr(answers, "aclose", None)
                if close is not None:
                    await close()

        return behavior

    def _unary_stream(
        self,
        method: str,
        rule: rules.Rule | None,
        inner: Callable[..., Any],
        parse: Callable[[bytes], Any] | None,
    ) -> Callable[..., AsyncIterator[Any]]:
        fetch = method in rules.FETCH_METHODS

        async def behavior(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            connections = self.connections
            if connections is None:
                async for item in admitted(request, context):
                    yield item
                return
            peer = await self._take_slot(connections, method, context)
            try:
                async for item in admitted(request, context):
                    yield item
            finally:
                connections.release(peer)

        async def admitted(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            caller, _, admission = await self._admit(method, rule, raw, context, parse)
            if admission.answer is not None:
                for item in admission.answer:
                    yield item
                return
            quotas = self.quotas if fetch and caller.service is None and caller.forwarded_by is None else None
            CURRENT_CALLER.set(caller)  # this generator runs in the RPC's own task: nothing leaks
            items = as_async_iter(inner(admission.request, context))
            if caller.authenticated_by == "token":
                items = self._while_token_valid(method, items, _bearer_token(context), context)
            async for item in items:
                yield item
                if quotas is not None:
                    # A stream has no throttle field: pace it here instead.
                    throttle_ms = quotas.record(caller.principal, QuotaKind.FETCH, item.ByteSize(), _now_ms())
                    if throttle_ms:
                        THROTTLE_MS.labels(QuotaKind.FETCH.value).inc(throttle_ms)
                        await asyncio.sleep(throttle_ms / 1000)

        return behavior

    async def _while_token_valid(
        self, method: str, items: AsyncIterator[Any], token: str | None, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        """The stream's items while its bearer token stays valid; then UNAUTHENTICATED.

        Checked before each item and every STREAM_TOKEN_RECHECK_S while none comes, so a
        revoked token neither receives another record nor keeps an idle stream open.
        """

        def valid() -> bool:
            return (
                token is not None
                and self.cache is not None
                and self.cache.verify_token(token, _wall_ms()) is not None
            )

        next_item: asyncio.Future[Any] = asyncio.ensure_future(items.__anext__())
        try:
            while True:
                done, _ = await asyncio.wait({next_item}, timeout=STREAM_TOKEN_RECHECK_S)
                if not valid():
                    await self._refuse(
                        context,
                        method,
                        "token_revoked_mid_stream",
                        grpc.StatusCode.UNAUTHENTICATED,
                        "the bearer token was revoked or expired while the stream was open",
                    )
                if not done:
                    continue
                try:
                    item = next_item.result()
                except StopAsyncIteration:
                    return
                yield item
                next_item = asyncio.ensure_future(items.__anext__())
        finally:
            if not next_item.done():
                next_item.cancel()
                # It may still end with an error of its own rather than cancelled (a read of the
                # next request fails once the call is aborted): retrieve it, nobody else will.
                next_item.add_done_callback(_retrieve_outcome)

    # ---- the checks -------------------------------------------------------------------------

    async def _take_slot(
        self, connections: ConnectionLimiter, method: str, context: grpc.aio.ServicerContext
    ) -> str:
        peer: str = context.peer()
        if not await connections.acquire(peer):
            await self._refuse(
                context,
                method,
                "too_many_requests",
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "too many concurrent requests on this connection; wait for answers first",
            )
        return peer

    async def _admit(
        self,
        method: str,
        rule: rules.Rule | None,
        raw: Any,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
    ) -> tuple[Caller, Any, rules.Admission]:
        """Authenticate, parse the request, run the method's rule; aborts the RPC on refusal."""
        caller = await self._authenticate(method, context)
        request, admission = await self._check(method, rule, caller, raw, context, parse)
        return caller, request, admission

    async def _check(
        self,
        method: str,
        rule: rules.Rule | None,
        caller: Caller,
        raw: Any,
        context: grpc.aio.ServicerContext,
        parse: Callable[[bytes], Any] | None,
    ) -> tuple[Any, rules.Admission]:
        """Parse an authenticated caller's request and run the method's rule; aborts on refusal.

        raw is always a request that arrived: a stream is checked on each of its messages, never
        on its opening (a rule skipped for want of a request let any certificate hold a
        BrokerHeartbeat for any broker, issue 37)."""
        if raw is None:
            raise RuntimeError(f"{method}: a rule was asked to check no request")
        request = raw
        if parse is not None:
            try:
                request = parse(raw)
            except Exception as exc:  # DecodeError, or anything a deserializer raises on garbage
                await self._refuse(
                    context,
                    method,
                    "malformed",
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request is not a valid message for {method} ({type(exc).__name__})",
                )
        if rule is None:
            await self._refuse(
                context,
                method,
                "no_rule",
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} has no authorization rule; refused",
            )
        authorizer = self.cache.authorizer if (self.acl and self.cache is not None) else None
        access = rules.Access(caller, authorizer, identities_checked=self.tls)
        try:
            admission = rule(request, access, self.limits)
        except rules.Denied as denied:
            await self._refuse(
                context, method, "forbidden", getattr(grpc.StatusCode, denied.code), denied.message
            )
        if access.denials:
            PARTITIONS_REFUSED.labels(method).inc(len(access.denials))
            log.debug(
                "%s for %s: refused %s",
                method,
                caller.describe(),
                ", ".join(f"{op.value} {res.type.value}:{res.name}" for op, res in access.denials[:10]),
            )
        return request, admission

    async def _authenticate(self, method: str, context: grpc.aio.ServicerContext) -> Caller:
        if not self.tls:
            return ANONYMOUS_CALLER
        auth = context.auth_context()
        names = auth.get("x509_common_name")
        common_name = names[0].decode(errors="replace") if names else ""
        metadata = context.invocation_metadata() or ()
        bearer = forwarded = None
        for key, value in metadata:
            if key == AUTHORIZATION_KEY:
                bearer = value
            elif key == FORWARDED_PRINCIPAL_KEY:
                forwarded = value
        if bearer is not None:
            token = tokens.bearer_value(
                bearer if isinstance(bearer, str) else bearer.decode(errors="replace")
            )
            principal = (
                self.cache.verify_token(token, _wall_ms()) if (token and self.cache is not None) else None
            )
            if principal is None:
                await self._refuse(
                    context,
                    method,
                    "bad_token",
                    grpc.StatusCode.UNAUTHENTICATED,
                    "the bearer token is unknown, revoked, expired or malformed",
                )
            caller = Caller(principal, service=None, authenticated_by="token")
        elif common_name:
            caller = certificate_caller(common_name)
        elif auth.get("x509_pem_cert"):
            await self._refuse(
                context,
                method,
                "no_common_name",
                grpc.StatusCode.UNAUTHENTICATED,
                "the client certificate has no common name, so it names no principal",
            )
        else:
            await self._refuse(
                context,
                method,
                "no_credentials",
                grpc.StatusCode.UNAUTHENTICATED,
                "no client certificate and no bearer token: authenticate with one of them",
            )
        if forwarded is not None:
            if caller.service is None or caller.service.kind != "gateway":
                await self._refuse(
                    context,
                    method,
                    "forged_forward",
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"only a gateway may act for another principal, not {caller.describe()}",
                )
            try:
                principal = check_principal(forwarded.decode() if isinstance(forwarded, bytes) else forwarded)
            except (ValueError, UnicodeDecodeError):
                await self._refuse(
                    context,
                    method,
                    "bad_forward",
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "the forwarded principal is malformed",
                )
            return Caller(principal, service=None, forwarded_by=caller.service, authenticated_by="forwarded")
        return caller

    async def _refuse(
        self, context: grpc.aio.ServicerContext, method: str, reason: str, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        """End the RPC with `code`: grpc.aio's `abort` raises, so no caller goes on past this."""
        REFUSED.labels(method, reason).inc()
        log.debug("refused %s (%s): %s", method, reason, message)
        await context.abort(code, message)
        raise RuntimeError(f"grpc.aio ServicerContext.abort returned for {method} instead of raising")

    async def _wait_out_throttle(
        self, quotas: QuotaManager, caller: Caller, kind: QuotaKind, context: grpc.aio.ServicerContext
    ) -> None:
        """A principal that did not back off as told waits here (Kafka mutes its channel instead)."""
        delay_ms = quotas.delay_ms(caller.principal, kind, _now_ms())
        if delay_ms <= 0:
            return
        remaining = context.time_remaining()
        delay_s = delay_ms / 1000
        if remaining is not None:
            delay_s = min(delay_s, max(remaining * QUOTA_DELAY_DEADLINE_SHARE, 0.0))
        await asyncio.sleep(delay_s)


class _OneRequestFeed:
    """The requests a unary-over-stream servicer reads: the one just admitted, and nothing more
    until it has been answered (the interceptor hands the next one over only then)."""

    __slots__ = ("_method", "_next")

    def __init__(self, method: str) -> None:
        self._method = method
        self._next: Any = None

    def put(self, request: Any) -> None:
        self._next = request

    def __aiter__(self) -> _OneRequestFeed:
        return self

    async def __anext__(self) -> Any:
        request, self._next = self._next, None
        if request is None:
            # A servicer that reads ahead breaks the one-answer-per-request order the interceptor
            # relies on to fix up and charge each answer: a bug, not a caller's fault.
            raise RuntimeError(f"{self._method}: the servicer read a request before answering the last")
        return request


class ForwardPrincipal(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """On a gateway: pass the client's principal on with the calls made on its behalf.

    Only for FORWARDED_METHODS and only while serving a client (CURRENT_CALLER is
    a principal, not a service), so the gateway's own calls (metadata refreshes)
    stay its own.
    """

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        caller = CURRENT_CALLER.get()
        if caller is not None and caller.service is None:
            method = client_call_details.method
            method = method.decode() if isinstance(method, bytes) else method
            if method in rules.FORWARDED_METHODS:
                metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
                metadata.add(FORWARDED_PRINCIPAL_KEY, caller.principal.encode())
                client_call_details = grpc.aio.ClientCallDetails(
                    client_call_details.method,
                    client_call_details.timeout,
                    metadata,
                    client_call_details.credentials,
                    client_call_details.wait_for_ready,
                )
        return await continuation(client_call_details, request)


async def _no_requests() -> AsyncIterator[Any]:
    """The requests of a stream its caller closed before sending one."""
    none: tuple[Any, ...] = ()
    for request in none:
        yield request


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    """Mark a dropped future's exception as seen, so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _bearer_token(context: grpc.aio.ServicerContext) -> str | None:
    """The token of the call's `authorization: Bearer ...` metadata, if any."""
    for key, value in context.invocation_metadata() or ():
        if key == AUTHORIZATION_KEY:
            return tokens.bearer_value(value if isinstance(value, str) else value.decode(errors="replace"))
    return None
