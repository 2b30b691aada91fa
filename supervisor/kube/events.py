"""ADAPTER: the `EventRecorder`: events.k8s.io/v1 Events posted from a background thread,
aggregated as client-go's correlator does (supervisor/eventseries.py)."""

from __future__ import annotations

import contextlib
import datetime as dt
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from supervisor import eventseries
from supervisor.kube.api import REPORTING_CONTROLLER
from supervisor.kube.errors import KubeError, map_error, request_timeout
from supervisor.model import EventSpec

# ---- events -------------------------------------------------------------------------------------

def micro_time(t: dt.datetime) -> str:
    """Format a MicroTime: exactly six fractional digits, UTC, 'Z'."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event_body(namespace: str, w: eventseries.Write, when: str, *, instance: str,
               regarding: Mapping[str, str]) -> dict[str, Any]:
    """The events.k8s.io/v1 Event the recorder creates for `w` (first seen at MicroTime
    `when`)."""
    spec = w.spec
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": w.name, "namespace": namespace},
            "eventTime": when, "type": spec.type, "reason": spec.reason,
            "action": spec.action, "note": spec.note[:1024],
            "reportingController": REPORTING_CONTROLLER, "reportingInstance": instance[:128],
            "regarding": dict(regarding)}


def series_patch(w: eventseries.Write, when: str) -> dict[str, Any]:
    """The patch that brings an Event's series to `w.count`, last observed at `when`."""
    return {"series": {"count": w.count, "lastObservedTime": when}}


class EventRecorder:
    """Posts events.k8s.io/v1 Events about the launcher pod from a background thread.

    `record` never blocks the caller; if the API is slow, up to `capacity` events queue up and
    further ones are dropped (counted). Repeated and similar Events become series and combined
    Events (eventseries.Correlator, as client-go's EventCorrelator), so a storm of decisions
    costs a bounded number of writes; the decisions' log lines are unaffected. Failures are
    reported through `on_error`; a write that stalls is given up after `timeout_s`.
    """

    def __init__(self, api: client.ApiClient, namespace: str, *,
                 regarding: Mapping[str, str], instance: str,
                 on_error: Callable[[KubeError], None], capacity: int = 1000,
                 timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.events = client.EventsV1Api(api)
        self.namespace, self.regarding, self.instance = namespace, regarding, instance
        self.on_error, self.timeout, self.clock = on_error, request_timeout(timeout_s), clock
        self.queue: queue.Queue[EventSpec | None] = queue.Queue(capacity)
        self.dropped = 0
        self.posted = 0  # Events created
        self.updated = 0  # series written
        self.recorded = 0
        self._thread = threading.Thread(target=self._run, name="event-recorder", daemon=True)
        self._thread.start()

    def record(self, spec: EventSpec) -> None:
        try:
            self.queue.put_nowait(spec)
            self.recorded += 1
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued and the series held back (up to `timeout` seconds) and stop
        the thread."""
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        series = eventseries.Correlator()
        while True:
            due = series.next_due()
            try:
                spec = self.queue.get(timeout=None if due is None
                                      else max(0.0, due - self.clock()))
            except queue.Empty:
                self._write(series.due(self.clock()))
                continue
            if spec is None:
                self._write(series.flush())
                return
            now = self.clock()
            name = f"{self.instance}.{uuid.uuid4().hex[:12]}"
            self._write(series.observe(spec, now, name) + series.due(now))

    def _write(self, writes: list[eventseries.Write]) -> None:
        for w in writes:
            when = micro_time(dt.datetime.now(dt.UTC))
            try:
                if w.create:
                    self.events.create_namespaced_event(self.namespace, event_body(
                        self.namespace, w, when, instance=self.instance,
                        regarding=self.regarding), _request_timeout=self.timeout)
                    self.posted += 1
                else:
                    self.events.patch_namespaced_event(w.name, self.namespace,
                                                       series_patch(w, when),
                                                       _request_timeout=self.timeout)
                    self.updated += 1
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
                verb = "create" if w.create else "update the series of"
                self.on_error(map_error(e, f"{verb} events.k8s.io/v1 Event"))


