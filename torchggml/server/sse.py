"""Server-sent events: the streamed answers of every endpoint ("data: {json}" lines; the
Anthropic and Responses protocols also name each event)."""
from __future__ import annotations

import json

from fastapi.responses import StreamingResponse

from .protocol import APIError


def sse(obj, event: str | None = None) -> str:
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {json.dumps(obj)}\n\n"


def event_stream(lines) -> StreamingResponse:
    """A server-sent events response of `lines` (an async iterator of SSE text)."""
    return StreamingResponse(lines, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse_response(chunks, done: str | None = None) -> StreamingResponse:
    """Chunks (an async iterator of dicts) as "data: {json}" events, then `done`; an APIError among
    them is sent as its error body and ends the stream."""
    async def lines():
        try:
            async for chunk in chunks:
                if isinstance(chunk, APIError):
                    yield sse(chunk.body())
                    return
                yield sse(chunk)
            if done is not None:
                yield done
        finally:
            await chunks.aclose()
    return event_stream(lines())
