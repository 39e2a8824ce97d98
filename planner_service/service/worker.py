"""The job worker: claims queued jobs from the database and runs them.

The same loop runs in ``planner worker`` processes (PostgreSQL: any number of them, on any
machines) and, on SQLite, in a thread inside the API process.

Correctness rests on the repository:

* a claim is atomic (``FOR UPDATE SKIP LOCKED`` / ``BEGIN IMMEDIATE``) and sets a lease;
* while a job runs, a heartbeat thread renews the lease, publishes progress and picks up cancel
  requests;
* the plan insert and the job's completion are one transaction that only succeeds while this
  worker still owns the job, so a job re-queued after a lost lease is never completed twice;
* a job whose worker died (lease expired) is claimed again by another worker, up to
  ``job_max_attempts`` claims.

A job runs in its tenant's view of the database (``Repository.scoped(job.tenant)``): it resolves
that tenant's saved clusters, models and profiles and stores its plan in that tenant.

Callbacks (``callback_url``) are safe to offer on a shared network:

* only hosts in ``PLANNER_CALLBACK_ALLOWED_HOSTS`` (empty: callbacks are off), checked when the
  request comes in (:func:`check_callback_url`, a 422);
* the host is resolved once when sending and every address must be public: loopback, private,
  link-local, reserved, multicast and cloud metadata addresses are refused (all but metadata may
  be allowed with ``PLANNER_CALLBACK_ALLOW_PRIVATE``); the POST goes to the address resolved, so a
  second DNS answer cannot move it;
* no redirects, no proxies from the environment, ``PLANNER_CALLBACK_TIMEOUT_S`` timeouts;
* signed: ``X-Planner-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` under
  ``PLANNER_CALLBACK_SECRET`` with ``X-Planner-Timestamp``;
* sent by a separate :class:`CallbackSender` thread with a bounded queue, so a slow receiver
  never holds a planning worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

import httpx

from cost_model.errors import InvalidInput, PlannerError
from planner_service.service.plans import JobCancelled, PlanService
from planner_service.settings import ServiceSettings
from planner_service.storage.repository import Repository, StoredJob

log = logging.getLogger("planner.worker")


#: Cloud metadata endpoints: refused even with PLANNER_CALLBACK_ALLOW_PRIVATE.
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"), ipaddress.ip_address("100.100.100.200")})
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data", "metadata.azure.com"})
_MAX_URL_CHARS = 2000


class CallbackRefused(ValueError):
    """A callback that must not be sent (the reason is the message)."""


def check_callback_url(url: str | None, settings: ServiceSettings) -> None:
    """At request time: an absolute http(s) URL whose host is allowed; else InvalidInput."""
    if url is None:
        return
    field = "callback_url"
    if len(url) > _MAX_URL_CHARS:
        raise InvalidInput(f"must be at most {_MAX_URL_CHARS} characters", field=field)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidInput("is not a valid URL", field=field) from None
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(f"must be an absolute http(s) URL, got {url[:100]!r}", field=field)
    if parts.username is not None or parts.password is not None:
        raise InvalidInput("must not carry user information", field=field)
    allowed = settings.callback_host_list
    if not allowed:
        raise InvalidInput("callbacks are off on this server (PLANNER_CALLBACK_ALLOWED_HOSTS is empty)", field=field)
    if host not in allowed:
        raise InvalidInput(f"host {host[:100]!r} is not in PLANNER_CALLBACK_ALLOWED_HOSTS", field=field)
    if host in METADATA_HOSTS:
        raise InvalidInput(f"host {host!r} is a metadata service", field=field)
    if port == 0:
        raise InvalidInput("has port 0", field=field)


def _address_problem(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_private: bool) -> str | None:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if addr.is_multicast or addr.is_unspecified:
        return "a multicast or unspecified address"
    if allow_private:
        return None
    for kind in ("loopback", "link_local", "private", "reserved"):
        if getattr(addr, f"is_{kind}"):
            return f"a {kind.replace('_', '-')} address"
    if not addr.is_global:
        return "not a public address"
    return None


def resolve_callback(url: str, settings: ServiceSettings, resolver: Callable[..., list] = socket.getaddrinfo) -> tuple[str, str]:
    """Resolve the callback host once: ``(url with the address as host, original host)``.
    Raises :class:`CallbackRefused` when the URL or any address it resolves to is not allowed."""
    try:
        check_callback_url(url, settings)
    except InvalidInput as exc:
        raise CallbackRefused(exc.message) from None
    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = resolver(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise CallbackRefused(f"cannot resolve {host!r}: {exc}") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not addresses:
        raise CallbackRefused(f"{host!r} has no address")
    for addr in addresses:
        problem = _address_problem(addr, settings.callback_allow_private)
        if problem:
            raise CallbackRefused(f"{host!r} resolves to {addr}, {problem}")
    first = addresses[0]
    shown = f"[{first}]" if first.version == 6 else str(first)
    pinned = urlunsplit((parts.scheme, f"{shown}:{port}", parts.path or "/", parts.query, ""))
    return pinned, host


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>``: HMAC-SHA256 of ``"<timestamp>." + body`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def post_callback(url: str, payload: dict, settings: ServiceSettings) -> None:
    """POST ``payload`` to ``url`` under the rules above (raises on refusal or failure)."""
    pinned, host = resolve_callback(url, settings)
    body = json.dumps(payload, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "Host": urlsplit(url).netloc.rsplit("@", 1)[-1], "X-Planner-Timestamp": timestamp}
    if settings.callback_secret:
        headers["X-Planner-Signature"] = sign(settings.callback_secret, timestamp, body)
    extensions = {"sni_hostname": host} if pinned.startswith("https") else {}
    with httpx.Client(timeout=settings.callback_timeout_s, follow_redirects=False, trust_env=False) as client:
        resp = client.post(pinned, content=body, headers=headers, extensions=extensions)
    if resp.status_code >= 300:
        raise CallbackRefused(f"the receiver answered {resp.status_code}")


class CallbackSender:
    """A thread that sends callbacks from a bounded queue (a full queue drops, with a warning)."""

    def __init__(self, send: Callable[[str, dict], None], maxsize: int = 1000) -> None:
        self._send = send
        self._queue: queue.Queue[tuple[str, dict] | None] = queue.Queue(maxsize=maxsize)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, url: str, payload: dict) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._main, name="planner-callbacks", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait((url, payload))
        except queue.Full:
            log.warning("callback queue full; dropped the callback of job %s", payload.get("job", {}).get("id"))

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            url, payload = item
            try:
                self._send(url, payload)
            except Exception as exc:  # noqa: BLE001 - a failing callback never fails anything else
                log.warning("callback for job %s not sent: %s", payload.get("job", {}).get("id"), exc)

    def stop(self, timeout_s: float = 2.0) -> None:
        with self._lock:
            thread = self._thread
        if thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                return
            thread.join(timeout_s)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class JobWorker:
    def __init__(
        self,
        repo: Repository,
        service: PlanService,
        settings: ServiceSettings,
        worker_id: str | None = None,
        post_callback: Callable[[str, dict], None] | None = None,
    ) -> None:
        self.repo = repo
        self.service = service
        self.settings = settings
        self.worker_id = worker_id or default_worker_id()
        self.wakeup = threading.Event()
        self.callbacks = CallbackSender(post_callback or self._http_callback)

    # ------------------------------------------------------------------ callbacks
    def _http_callback(self, url: str, payload: dict) -> None:
        post_callback(url, payload, self.settings)

    def _notify(self, job: StoredJob) -> None:
        if job.callback_url:
            self.callbacks.submit(job.callback_url, {"event": "job.finished", "job": job.to_dict()})

    # ------------------------------------------------------------------ one job
    def run_one(self) -> bool:
        """Claim and run one job.  Returns False when no job was waiting."""
        s = self.settings
        job = self.repo.claim_job(self.worker_id, s.job_lease_timeout_s, s.job_max_attempts)
        if job is None:
            return False
        log.info("worker %s claimed job %s (attempt %d)", self.worker_id, job.id, job.attempts)
        repo = self.repo.scoped(job.tenant)
        service = self.service.for_repository(repo)
        progress = {"value": 0.0}
        cancel = threading.Event()
        lost = threading.Event()
        done = threading.Event()
        interval = max(0.05, min(1.0, s.job_lease_timeout_s / 3.0))

        def heartbeat() -> None:
            while not done.wait(interval):
                try:
                    owned, cancel_requested = self.repo.renew_lease(job.id, self.worker_id, s.job_lease_timeout_s, progress["value"])
                except Exception as exc:  # noqa: BLE001 - DB hiccup: try again next beat
                    log.warning("lease renewal of job %s failed: %s", job.id, exc)
                    continue
                if cancel_requested:
                    cancel.set()
                if not owned:
                    lost.set()
                    return

        beat = threading.Thread(target=heartbeat, name=f"lease-{job.id[:8]}", daemon=True)
        beat.start()

        def on_progress(fraction: float) -> None:
            with contextlib.suppress(TypeError, ValueError):
                progress["value"] = max(0.0, min(1.0, float(fraction)))

        def should_cancel() -> bool:
            return cancel.is_set() or lost.is_set()

        new = None
        error: dict | None = None
        try:
            new = service.compute_for_job(job, on_progress, should_cancel)
        except JobCancelled:
            pass
        except PlannerError as exc:
            error = exc.to_dict()
        except Exception as exc:  # noqa: BLE001 - a bug must fail the job, not kill the worker
            log.error("job %s failed with an internal error: %s", job.id, type(exc).__name__)
            log.debug("job %s internal error detail", job.id, exc_info=True)
            error = {"code": "internal_error", "message": f"internal error while planning: {type(exc).__name__}", "field": None}
        finally:
            done.set()
            beat.join()
        # A planner stopped by should_cancel may return or raise: either way the job is cancelled.
        if lost.is_set():
            log.warning("job %s: lease lost; another worker owns it now", job.id)
            return True
        if cancel.is_set() or self.repo.get_job(job.id).cancel_requested:
            self.repo.mark_job_cancelled(job.id, self.worker_id)
        elif error is not None:
            self.repo.fail_job(job.id, self.worker_id, error)
        elif new is not None and repo.complete_job_with_plan(job.id, self.worker_id, new, force=job.force) is None:
            log.warning("job %s: not completed by %s (lease lost or cancelled)", job.id, self.worker_id)
            if self.repo.get_job(job.id).cancel_requested:
                self.repo.mark_job_cancelled(job.id, self.worker_id)
        self._notify(self.repo.get_job(job.id))
        return True

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, max_jobs: int | None = None) -> int:
        """Run jobs until ``stop`` is set (or ``max_jobs`` ran).  Returns the number of jobs run.
        A job in progress is finished before stopping."""
        ran = 0
        while not stop.is_set():
            try:
                worked = self.run_one()
            except Exception as exc:  # noqa: BLE001 - database down etc.: back off and retry
                log.warning("worker %s: %s", self.worker_id, exc)
                worked = False
            if worked:
                ran += 1
                if max_jobs is not None and ran >= max_jobs:
                    break
                continue
            self.wakeup.wait(self.settings.worker_poll_interval_s)
            self.wakeup.clear()
        self.callbacks.stop()
        return ran


class WorkerThread:
    """The in-process worker of a SQLite deployment (started and stopped by the app lifespan)."""

    def __init__(self, worker: JobWorker) -> None:
        self.worker = worker
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._main, name="planner-worker", daemon=True)

    def _main(self) -> None:
        self.worker.run(self.stop_event)

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        self.worker.wakeup.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stop_event.set()
        self.worker.wakeup.set()
        self.thread.join(timeout_s)


__all__ = [
    "CallbackRefused",
    "CallbackSender",
    "JobWorker",
    "WorkerThread",
    "check_callback_url",
    "default_worker_id",
    "post_callback",
    "resolve_callback",
    "sign",
]
