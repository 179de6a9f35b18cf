"""An inbox runner on asyncio: Go's ``client.Runner`` in Python.

``Runner`` leases batches of an inbox's items over the HTTP API, calls an
async handler with bounded concurrency, extends the leases of jobs that
run long, and acks or nacks each item by what the handler did:

- it returned: ack (acks are batched, one request per lease);
- it raised ``Permanent``: nack as a dead letter at once;
- it raised ``RetryAfter(seconds)``: nack, next attempt after that long
  at least (or the backoff, if longer);
- it raised anything else: nack, next attempt after the backoff (full
  jitter, doubling from ``backoff_base`` up to ``backoff_max``). The server
  dead-letters an item after its last attempt (``serve --max-attempts``).

``stop()`` (or cancelling the task running ``run``) stops it gracefully:
no new lease; running handlers get ``shutdown_timeout`` seconds to finish
(their leases still extended) and are then cancelled; an item whose
handler was cut off, and one leased but not started, is nacked without
delay so that another runner takes it at once. A lease request cut off by
the stop may have leased items whose answer never came: they wait for
their visibility timeout.

A handler whose lease was lost (it expired, or an operator settled the
item) is cancelled and its item is not settled: it is no longer this
runner's. Handlers must be idempotent: an item is handled at least once
(``item["event_id"]`` is the same on every attempt; see
``postbox.dedup``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import unicodedata
from collections.abc import Awaitable, Callable
from typing import Optional

from .api import API, APIError, CallError, Item, Lease, result_error

__all__ = ["Runner", "Permanent", "RetryAfter", "Handler", "DEFAULT_CONCURRENCY",
           "DEFAULT_VISIBILITY_TIMEOUT", "DEFAULT_WAIT"]

Handler = Callable[[Item], Awaitable[object]]

DEFAULT_CONCURRENCY = 10
DEFAULT_VISIBILITY_TIMEOUT = 30.0
DEFAULT_WAIT = 20.0
_MAX_REASON = 1024  # the most the server keeps of a nack's reason
_LINGER = 0.002  # wait up to this long for half a batch of free slots


class Permanent(Exception):
    """Raised by a handler: no attempt can succeed; the item is a dead
    letter at once (Go's ``retry.Permanent``)."""


class RetryAfter(Exception):
    """Raised by a handler: try again after ``delay`` seconds at least (Go's
    ``retry.RetryAfter``)."""

    def __init__(self, delay: float, message: str = ""):
        self.delay = delay
        super().__init__(message or f"retry after {delay:g}s")


def clean_reason(s: str) -> str:
    """s as a nack reason the server takes: control characters become
    spaces, at most 1024 UTF-8 bytes."""
    s = "".join(" " if unicodedata.category(c) == "Cc" else c for c in s)
    s = s.encode("utf-8", "replace").decode("utf-8")
    b = s.encode("utf-8")
    if len(b) <= _MAX_REASON:
        return s
    return b[: _MAX_REASON - 3].decode("utf-8", "ignore") + "…"


def _describe(e: BaseException) -> str:
    msg = str(e)
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _uncancel(task: "asyncio.Task[object]") -> None:
    """Forget a cancellation the runner made and handled (Python 3.11+
    counts them; asyncio.timeout and TaskGroup read the count)."""
    uncancel = getattr(task, "uncancel", None)
    if uncancel is not None:
        uncancel()


class _Job:
    """One running item: its task, its heartbeat, and why it was
    cancelled."""

    __slots__ = ("task", "timer", "beat", "done", "lost", "cut")

    def __init__(self, task: "asyncio.Task[object]"):
        self.task = task
        self.timer: Optional[asyncio.TimerHandle] = None
        self.beat: Optional["asyncio.Future[None]"] = None
        self.done = self.lost = self.cut = False


class Runner:
    """Runs ``handler`` over the items of ``inbox``; ``await run()``.

    concurrency bounds the handlers running at once (default 10); batch the
    items of one lease (default concurrency, at most 1000);
    visibility_timeout (seconds, default 30) is how long a lease holds its
    items, extended every heartbeat (default a third of it) while a job
    runs; wait (default 20, at most 60) is the lease's long poll;
    shutdown_timeout (default visibility_timeout) how long ``stop`` lets
    running handlers finish.
    """

    def __init__(
        self,
        api: API,
        inbox: str,
        handler: Handler,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        batch: int | None = None,
        visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT,
        heartbeat: float | None = None,
        wait: float = DEFAULT_WAIT,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        shutdown_timeout: float | None = None,
        logger: logging.Logger | None = None,
    ):
        if handler is None:
            raise ValueError("Runner: no handler")
        if concurrency <= 0:
            concurrency = DEFAULT_CONCURRENCY
        self.api, self.inbox, self.handler = api, inbox, handler
        self.concurrency = concurrency
        self.batch = min(batch if batch and batch > 0 else concurrency, 1000)
        self.visibility_timeout = visibility_timeout if visibility_timeout > 0 else DEFAULT_VISIBILITY_TIMEOUT
        if heartbeat is None or heartbeat <= 0 or heartbeat >= self.visibility_timeout:
            heartbeat = self.visibility_timeout / 3
        self.heartbeat = heartbeat
        self.wait = min(wait if wait > 0 else DEFAULT_WAIT, 60.0)
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.shutdown_timeout = shutdown_timeout if shutdown_timeout and shutdown_timeout > 0 else self.visibility_timeout
        self.log = logger or logging.getLogger("postbox.runner")
        self._stopping = asyncio.Event()
        self._free = concurrency
        self._freed = asyncio.Event()
        self._running: set[_Job] = set()
        self._cut = False
        self._acks: asyncio.Queue[Optional[tuple[str, int]]] = asyncio.Queue()

    def stop(self) -> None:
        """Stop gracefully: ``run`` returns once every leased item is
        acked or nacked."""
        self._stopping.set()

    def backoff(self, attempts: int) -> float:
        """The wait before the next attempt of an item whose handler
        failed after attempts attempts (full jitter)."""
        n = max(attempts - 1, 0)
        ceiling = self.backoff_max if n >= 63 else min(self.backoff_max, self.backoff_base * (2**n))
        return random.uniform(0, ceiling) if ceiling > 0 else 0.0

    def _release(self, n: int) -> None:
        self._free += n
        self._freed.set()

    async def _take_slots(self) -> int:
        """Wait for a free slot, then take the free ones up to a batch,
        waiting up to linger for half of one. 0 when stopping."""
        while self._free == 0:
            self._freed.clear()
            stop = asyncio.ensure_future(self._stopping.wait())
            freed = asyncio.ensure_future(self._freed.wait())
            await asyncio.wait({stop, freed}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            freed.cancel()
            if self._stopping.is_set():
                return 0
        if self._free * 2 < self.batch:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _LINGER
            while self._free * 2 < self.batch and not self._stopping.is_set():
                left = deadline - loop.time()
                if left <= 0:
                    break
                self._freed.clear()
                try:
                    await asyncio.wait_for(self._freed.wait(), left)
                except asyncio.TimeoutError:
                    break
        n = min(self._free, self.batch)
        self._free -= n
        return n

    async def run(self) -> None:
        """Handle the inbox's items until ``stop`` (or cancellation); then
        return once every leased item is settled. Raises ``APIError`` when
        the server refuses the runner for good (a wrong token, an inbox
        name it does not accept)."""
        acker = asyncio.ensure_future(self._ack_loop())
        jobs: set[asyncio.Task[None]] = set()
        cancelled = False
        failures = 0
        lease_task: Optional[asyncio.Future[Lease]] = None
        try:
            while not self._stopping.is_set():
                n = await self._take_slots()
                if n == 0:
                    break
                lease_task = asyncio.ensure_future(
                    self.api.lease(self.inbox, max=n, visibility_timeout=self.visibility_timeout, wait=self.wait)
                )
                stop = asyncio.ensure_future(self._stopping.wait())
                try:
                    await asyncio.wait({lease_task, stop}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop.cancel()
                if not lease_task.done():
                    lease_task.cancel()
                    self._release(n)
                    break
                try:
                    lease = lease_task.result()
                except (APIError, CallError) as e:
                    self._release(n)
                    if isinstance(e, APIError) and (e.unauthorized or e.invalid):
                        raise
                    delay = min(5.0, 0.1 * 2**failures)
                    failures += 1
                    self.log.warning("postbox runner: lease failed; trying again in %.1fs: %s", delay, e)
                    try:
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                    continue
                failures = 0
                items = lease["items"]
                self._release(n - len(items))
                for it in items:
                    t = asyncio.ensure_future(self._job(lease["lease"], it))
                    jobs.add(t)
                    t.add_done_callback(jobs.discard)
        except asyncio.CancelledError:
            cancelled = True  # a cancelled run shuts down as stop() does
        finally:
            self._stopping.set()
            if lease_task is not None and not lease_task.done():
                lease_task.cancel()  # what it leased waits for its visibility timeout
            await self._shutdown(jobs)
            await self._acks.put(None)
            await acker
        if cancelled:
            raise asyncio.CancelledError

    async def _shutdown(self, jobs: set[asyncio.Task[None]]) -> None:
        if not jobs:
            return
        _, pending = await asyncio.wait(set(jobs), timeout=self.shutdown_timeout)
        if pending:
            self._cut = True
            for job in list(self._running):
                if not job.done:
                    job.cut = True
                    job.task.cancel()
            await asyncio.wait(pending)

    async def _job(self, lease: str, it: Item) -> None:
        try:
            if self._stopping.is_set():  # leased as the shutdown began: give it back
                await self._nack(lease, it, 0.0, "not started: the runner stopped", False)
                return
            await self._work(lease, it)
        finally:
            self._release(1)

    async def _work(self, lease: str, it: Item) -> None:
        """Run the handler in this task, extending the lease every
        heartbeat meanwhile (a timer, so that a quick job costs no more
        than its call), then settle the item."""
        task = asyncio.current_task()
        assert task is not None
        job = _Job(task)
        job.timer = asyncio.get_running_loop().call_later(self.heartbeat, self._beat, lease, it, job)
        self._running.add(job)
        err: Optional[BaseException] = None
        try:
            res = self.handler(it)
            if not inspect.isawaitable(res):
                raise TypeError(f"the handler returned {type(res).__name__}, not an awaitable: make it an async def")
            await res
        except asyncio.CancelledError:
            if not (job.lost or job.cut):
                raise  # not ours: the job's task itself was cancelled
            _uncancel(task)
        except Exception as e:
            err = e
        finally:
            job.done = True
            if job.timer is not None:
                job.timer.cancel()
            if job.beat is not None and not job.beat.done():
                job.beat.cancel()  # an extend in flight: the job is over
            self._running.discard(job)
        if job.lost:
            return  # not ours to settle any more
        if job.cut:
            # Cut off by the shutdown: give it back at once.
            await self._nack(lease, it, 0.0, "cut off: the runner stopped", False)
            return
        if err is None:
            await self._acks.put((lease, it["id"]))
            return
        if isinstance(err, Permanent):
            self.log.warning("postbox runner: handler failed for good; nacked as a dead letter: item %s (%s): %s",
                             it["id"], it["event_id"], _describe(err))
            await self._nack(lease, it, 0.0, _describe(err), True)
            return
        delay = self.backoff(it["attempts"])
        if isinstance(err, RetryAfter):
            delay = max(delay, err.delay)
        if self._cut:
            delay = 0.0
        self.log.info("postbox runner: handler failed; nacked: item %s (%s), attempt %s, retry in %.1fs: %s",
                      it["id"], it["event_id"], it["attempts"], delay, _describe(err))
        await self._nack(lease, it, delay, _describe(err), False)

    def _beat(self, lease: str, it: Item, job: "_Job") -> None:
        if not job.done:
            job.timer = None
            job.beat = asyncio.ensure_future(self._beat_async(lease, it, job))

    async def _beat_async(self, lease: str, it: Item, job: "_Job") -> None:
        ok = await self._extend(lease, it)
        if job.done:
            return
        if not ok:
            job.lost = True
            job.task.cancel()
            return
        job.timer = asyncio.get_running_loop().call_later(self.heartbeat, self._beat, lease, it, job)

    async def _extend(self, lease: str, it: Item) -> bool:
        """Extend it's lease; False when the lease is lost."""
        try:
            ext = await self.api.extend(self.inbox, lease, [it["id"]], self.visibility_timeout)
            err = result_error(ext["items"][0]) if len(ext["items"]) == 1 else None
        except (APIError, CallError) as e:
            err = e
        if isinstance(err, APIError) and (err.lease_lost or err.not_found):
            self.log.warning("postbox runner: lost the lease of a running item; its handler is cancelled: item %s (%s): %s",
                             it["id"], it["event_id"], err)
            return False
        if err is not None:
            self.log.warning("postbox runner: extending a lease failed; trying again: item %s: %s", it["id"], err)
        return True

    async def _nack(self, lease: str, it: Item, delay: float, reason: str, dead: bool) -> None:
        try:
            res = await self.api.nack(self.inbox, lease, [it["id"]], delay=min(delay, 86400.0),
                                      reason=clean_reason(reason), dead=dead)
            err = result_error(res[0]) if len(res) == 1 else None
        except (APIError, CallError) as e:
            err = e
        if err is not None:
            self.log.warning("postbox runner: nack failed; the item is attempted again when its lease ends: item %s: %s",
                             it["id"], err)

    async def _ack_loop(self) -> None:
        """Ack what arrives, as few requests as it can: every ack waiting,
        one request per lease."""
        while True:
            first = await self._acks.get()
            if first is None:
                return
            by_lease: dict[str, list[int]] = {first[0]: [first[1]]}
            n, end = 1, False
            while n < 1000 and not self._acks.empty():
                a = self._acks.get_nowait()
                if a is None:
                    end = True
                    break
                by_lease.setdefault(a[0], []).append(a[1])
                n += 1
            for lease, ids in by_lease.items():
                await self._ack(lease, ids)
            if end:
                return

    async def _ack(self, lease: str, ids: list[int]) -> None:
        try:
            res = await self.api.ack(self.inbox, lease, ids)
        except (APIError, CallError) as e:
            self.log.warning("postbox runner: ack of %d items failed; they are attempted again when their lease ends: %s",
                             len(ids), e)
            return
        for r in res:
            err = result_error(r)
            if err is not None:
                self.log.warning("postbox runner: ack refused; the item is attempted again: item %s: %s", r.get("id"), err)
