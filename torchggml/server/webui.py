"""The chat page at `/` (llama-server serves one too): one static file, static/index.html, plain
HTML and JavaScript with no build step. Conversations stay in the browser (localStorage); replies
stream from /v1/chat/completions; settings (temperature, top_p, max tokens, the API key) beside
them. The page itself needs no key: the API calls it makes carry the one typed in its settings."""
from __future__ import annotations

from importlib import resources

PAGE = resources.files(__package__).joinpath("static", "index.html")


def register(app) -> None:
    from fastapi.responses import HTMLResponse

    @app.get("/", include_in_schema=False)
    async def index():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))
