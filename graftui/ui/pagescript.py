"""A script the page runs before Gradio's own: it slows Gradio's elapsed-time counters to four frames a second.

Gradio's status tracker counts the seconds of a pending event on every animation frame, and the
tracker shown while the page loads is removed while still pending, so its loop never stops: an
open page draws 60 frames a second for as long as it is open. Measured on the Localize tab in
headless Chromium: 0.08–0.12 of a core with nothing to show (0.03 without the loop), 0.20–0.23 of
a core while a localization runs (0.15–0.17 without it) — taken from the job on a small machine.

The script must run before Gradio's modules, which keep their own reference to
``requestAnimationFrame``; ``gr.Blocks(head=…)`` is added after they load, so the script is put at
the top of the served page's ``<head>`` by a small ASGI middleware instead. It only delays the
frames the status tracker asks for (recognised by its module in the call stack); every other
animation is untouched, and a counter still ticks, four times a second.
"""

from __future__ import annotations

FRAME_DELAY_MS = 250

SCRIPT = f"""<script>
(() => {{
  const frame = window.requestAnimationFrame.bind(window);
  window.requestAnimationFrame = (callback) => {{
    if ((new Error().stack || "").includes("statustracker")) {{
      setTimeout(() => frame(callback), {FRAME_DELAY_MS});
      return 0;  /* cancelAnimationFrame(0) does nothing; the tracker never cancels */
    }}
    return frame(callback);
  }};
}})();
</script>"""


class EarlyScript:
    """ASGI middleware: ``script`` right after ``<head>`` in every HTML page the app serves."""

    def __init__(self, app, script: str = SCRIPT):
        self.app = app
        self.tag = script.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET":
            await self.app(scope, receive, send)
            return
        start, chunks = None, []

        async def forward(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                if headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers:
                    start = message  # held until the whole page is here
                    return
            elif start is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                body = b"".join(chunks).replace(b"<head>", b"<head>" + self.tag, 1)
                headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, forward)


def app_kwargs() -> dict:
    """What ``launch(app_kwargs=…)`` needs to serve the page with the script."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(EarlyScript)]}
