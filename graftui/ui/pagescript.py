"""A script the page runs before Gradio's own: it holds Gradio's status-tracker frames to four a second.

Gradio's status tracker counts the seconds of a pending event on every animation frame, and the
tracker shown while the page loads is removed while still pending, so its loop never stops: an
open page asks for 60 frames a second for as long as it is open. Measured in headless Chromium on
the Localize tab: an idle page took 0.20 of a core before and 0.12–0.14 with this script (0.08–0.12
before and 0.03 with it when the page's polling is off); a page watching a localization took
0.20–0.23 before and 0.15–0.17 with it — taken from the job on a small machine.

The script must run before Gradio's modules, which keep their own reference to
``requestAnimationFrame``; ``gr.Blocks(head=…)`` is added after they load, so the script is put at
the top of the served page's ``<head>`` by a small ASGI middleware instead. It delays the frames
asked for from within the status tracker's module (its elapsed-time counter, its loading spinner's
first step); every other frame is asked for as before. A held frame can still be cancelled.

It also makes typing into a picker narrow its choices. Gradio's dropdown filters its choices by the text in its box,
and the box keeps the label of what is picked when it opens: what is typed is added after that label, and no choice
holds the two (a region's label is long, so its end is out of sight). Focusing a picker selects its text, so what is
typed ("seed 1", a task, a model) replaces it and the list narrows to the choices that hold it.

On a phone (PHONE_WIDTH or narrower) the accordions marked ``phone-closed`` (the secondary parts of a tab: calibration
plots, examples the models disagree on) are closed once each as they appear, so a tab is as tall as its main result;
one opened by hand stays open. On a wider window they stay as the app builds them, open.
"""

from __future__ import annotations

FRAME_DELAY_MS = 250
PHONE_WIDTH = 560  # px, as ``style.PHONE_WIDTH``

SCRIPT = f"""<script>
(() => {{
  const frame = window.requestAnimationFrame.bind(window);
  const cancel = window.cancelAnimationFrame.bind(window);
  const held = new Map();
  let last = 0;
  window.requestAnimationFrame = (callback) => {{
    if (!(new Error().stack || "").includes("statustracker")) return frame(callback);
    const id = --last;  /* negative: never one of the browser's own ids */
    held.set(id, setTimeout(function graftuiHeldFrame() {{
      held.set(id, -frame((time) => {{ held.delete(id); callback(time); }}));  /* negative: a frame, not a timer */
    }}, {FRAME_DELAY_MS}));
    return id;
  }};
  window.cancelAnimationFrame = (id) => {{
    if (!held.has(id)) return cancel(id);
    const pending = held.get(id);
    held.delete(id);
    return pending < 0 ? cancel(-pending) : clearTimeout(pending);
  }};
  document.addEventListener("focusin", (event) => {{
    const box = event.target;
    if (!(box instanceof HTMLInputElement) || box.getAttribute("role") !== "combobox" || box.readOnly) return;
    setTimeout(() => {{ if (document.activeElement === box && box.value) box.select(); }}, 0);
  }}, true);
  const phone = window.matchMedia("(max-width: {PHONE_WIDTH}px)");
  const closeSecondary = () => {{
    if (!phone.matches) return;
    document.querySelectorAll(".phone-closed:not([data-graftui-closed])").forEach((part) => {{
      const button = part.querySelector("button.label-wrap");
      if (!button) return;
      part.dataset.graftuiClosed = "1";
      if (button.classList.contains("open")) button.click();
    }});
  }};
  phone.addEventListener("change", closeSecondary);
  new MutationObserver(() => {{ if (phone.matches) closeSecondary(); }})
    .observe(document.documentElement, {{ childList: true, subtree: true }});
}})();
</script>"""

# Gradio's own routes that may return HTML files (uploads, served folders, its static assets): left untouched.
PASS_THROUGH = ("/gradio_api/", "/file=", "/static/", "/assets/", "/proxy=", "/custom_component/")


class EarlyScript:
    """ASGI middleware: ``script`` right after ``<head>`` in the app's own pages (GET, 200, HTML)."""

    def __init__(self, app, script: str = SCRIPT):
        self.app = app
        self.tag = script.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or any(p in scope.get("path", "") for p in PASS_THROUGH):
            await self.app(scope, receive, send)
            return
        start, chunks = None, []

        async def forward(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = {k.lower(): v for k, v in message.get("headers", [])}
                if message.get("status") == 200 and headers.get(b"content-type", b"").startswith(b"text/html") \
                        and b"content-encoding" not in headers:
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
            elif start is not None:  # something other than a body (a server's file-sending extension): stop holding
                held, start = start, None
                await send(held)
                for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunks.clear()
            await send(message)

        await self.app(scope, receive, forward)


def app_kwargs() -> dict:
    """What ``launch(app_kwargs=…)`` needs to serve the page with the script."""
    from starlette.middleware import Middleware

    return {"middleware": [Middleware(EarlyScript)]}
