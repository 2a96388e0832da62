"""Events (ggml_backend_event_*): marks recorded on a backend's stream that other streams or
the host wait for. A device without events (CPU) gives None from backend_event_new."""
from __future__ import annotations

from .impl import Event


def backend_event_new(device) -> Event | None:
    """A new event on the device, or None when the device has no events."""
    if device is None or device.event_new is None:
        return None
    return device.event_new()


def backend_event_free(event: Event | None) -> None:
    if event is not None:
        event.device.event_free(event)


def backend_event_record(event: Event, backend) -> None:
    """Mark the work queued on `backend` so far; the event must belong to the backend's device."""
    _require_event(event, "backend_event_record")
    if backend.event_record is None:
        raise NotImplementedError(f"backend_event_record: backend {backend.get_name()} has no events")
    backend.event_record(event)


def backend_event_synchronize(event: Event) -> None:
    """Block the host until the work marked by the event's latest record is done."""
    _require_event(event, "backend_event_synchronize")
    if event.device.event_synchronize is None:
        raise NotImplementedError(f"device {event.device.name} has no events")
    event.device.event_synchronize(event)


def backend_event_wait(backend, event: Event) -> None:
    """Make work queued on `backend` after this call wait for the event (the host does not wait)."""
    _require_event(event, "backend_event_wait")
    if backend.event_wait is None:
        raise NotImplementedError(f"backend_event_wait: backend {backend.get_name()} cannot wait for events")
    backend.event_wait(event)


def _require_event(event, what: str) -> None:
    if not isinstance(event, Event):
        raise TypeError(f"{what}: expected an Event from backend_event_new, got {type(event).__name__}")
