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
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import traceback
import uuid
from collections.abc import Callable

import httpx

from cost_model.errors import PlannerError
from planner_service.service.plans import JobCancelled, PlanService
from planner_service.settings import ServiceSettings
from planner_service.storage.repository import Repository, StoredJob

log = logging.getLogger("planner.worker")


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
        self._post_callback = post_callback or self._http_callback

    # ------------------------------------------------------------------ callbacks
    def _http_callback(self, url: str, payload: dict) -> None:
        with httpx.Client(timeout=self.settings.callback_timeout_s, follow_redirects=False) as client:
            client.post(url, json=payload).raise_for_status()

    def _notify(self, job: StoredJob) -> None:
        if not job.callback_url:
            return
        payload = {"event": "job.finished", "job": job.to_dict()}
        try:
            self._post_callback(job.callback_url, payload)
        except Exception as exc:  # noqa: BLE001 - a failing callback never fails the job
            log.warning("callback to %s for job %s failed: %s", job.callback_url, job.id, exc)

    # ------------------------------------------------------------------ one job
    def run_one(self) -> bool:
        """Claim and run one job.  Returns False when no job was waiting."""
        s = self.settings
        job = self.repo.claim_job(self.worker_id, s.job_lease_timeout_s, s.job_max_attempts)
        if job is None:
            return False
        log.info("worker %s claimed job %s (attempt %d)", self.worker_id, job.id, job.attempts)
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
            try:
                progress["value"] = max(0.0, min(1.0, float(fraction)))
            except (TypeError, ValueError):
                pass

        def should_cancel() -> bool:
            return cancel.is_set() or lost.is_set()

        new = None
        error: dict | None = None
        try:
            new = self.service.compute_for_job(job, on_progress, should_cancel)
        except JobCancelled:
            pass
        except PlannerError as exc:
            error = exc.to_dict()
        except Exception as exc:  # noqa: BLE001 - a bug must fail the job, not kill the worker
            log.error("job %s failed with an internal error:\n%s", job.id, traceback.format_exc())
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
        elif new is not None:
            if self.repo.complete_job_with_plan(job.id, self.worker_id, new, force=job.force) is None:
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


__all__ = ["JobWorker", "WorkerThread", "default_worker_id"]
