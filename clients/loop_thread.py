"""A private asyncio event loop on a daemon thread: how the synchronous clients reuse the async ones.

Producer, Consumer and Admin each own one. The gRPC channels, the sender task and
every awaited call live on that loop; the caller's thread hands it coroutines
and blocks on the result with a timeout. The thread is a daemon so a program
that forgets close() can still exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, Generic, Protocol, Self, TypeVar, TypeVarTuple

from clients.config import LOOP_STOP_WAIT_S
from clients.errors import ClientClosed, RequestTimedOut

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class _AsyncClient(Protocol):
    async def close(self) -> None: ...


A = TypeVar("A", bound=_AsyncClient)


class _ClientLoop(asyncio.SelectorEventLoop):
    """An event loop that ignores callbacks handed to it from other threads once it is closed.

    grpc.aio has one completion-queue poller per process, shared by every loop that made a
    channel: whichever loop wakes up hands each core completion to its own loop with
    call_soon_threadsafe. A call or stream whose completion grpc core delivers only after
    its client's loop closed (one close() cancelled but the core finished late, on a busy
    machine; one still open when the loop stopped) would make that hand-over
    raise "Event loop is closed" inside the waking loop, printed on stderr and ending its
    pass over the queue, which delays the completions of the live clients behind it. Such a
    completion only settles a future nobody awaits any more, so dropping it is right.
    """

    def call_soon_threadsafe(
        self,
        callback: Callable[[*Ts], object],
        *args: *Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        except RuntimeError:
            if not self.is_closed():
                raise
            handle = asyncio.Handle(callback, args, self, context)
            handle.cancel()
            return handle


class LoopThread:
    """One event loop running on its own thread until stop()."""

    def __init__(self, name: str) -> None:
        self.loop = _ClientLoop()
        self._stopped = False
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._started.set)
        try:
            self.loop.run_forever()
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    @property
    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on the loop; its concurrent future."""
        if self._stopped:
            coro.close()
            raise ClientClosed("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_ms: int | None = None, what: str = "the call") -> T:
        """Run `coro` on the loop and wait for its result (RequestTimedOut after timeout_ms).

        On a timeout or an interrupt (Ctrl-C) the coroutine is cancelled, so nothing
        keeps running behind the caller's back.
        """
        if self.in_loop_thread:
            raise RuntimeError("a synchronous client method was called from its own callback thread")
        future = self.submit(coro)
        try:
            return future.result(None if timeout_ms is None else timeout_ms / 1000)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimedOut(f"{what} did not finish within {timeout_ms} ms") from None
        except BaseException:
            future.cancel()
            raise

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop thread soon (safe from any thread)."""
        if not self._stopped:
            try:
                self.loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # the loop closed under us: nothing left to wake
                pass

    def stop(self) -> None:
        """Stop the loop and join its thread. Pending tasks are cancelled first."""
        if self._stopped:
            return
        self._stopped = True

        async def _cancel_and_stop() -> None:
            me = asyncio.current_task()
            tasks = [task for task in asyncio.all_tasks(self.loop) if task is not me]
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=LOOP_STOP_WAIT_S) if tasks else None
            self.loop.stop()

        try:
            asyncio.run_coroutine_threadsafe(_cancel_and_stop(), self.loop)
        except RuntimeError:
            return
        if not self.in_loop_thread:
            self._thread.join(LOOP_STOP_WAIT_S)


class SyncClient(Generic[A]):
    """A synchronous client that drives an async one (`_async`) on its own LoopThread.

    Admin and Consumer build on it: each method hands a coroutine of `_async` to `_run`.
    """

    def __init__(self, async_client: A, thread_name: str) -> None:
        self._async = async_client
        self._thread = LoopThread(thread_name)
        # A client dropped without close() still ends its thread (nothing on the loop refers back to us).
        weakref.finalize(self, self._thread.stop)

    def _run(self, coro: Coroutine[Any, Any, T], what: str) -> T:
        return self._thread.run(coro, None, what)

    def close(self) -> None:
        """Close the async client (see its close()), then stop the loop thread."""
        try:
            self._run(self._async.close(), "close()")
        finally:
            self._thread.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
