#!/usr/bin/env python3
"""The browser check of the wireview example: a todo list shared by two daphne processes through NATS.

    build/wireview-venv/bin/python examples/wireview/check.py [--server uvicorn] [--serve]

(`make wireview-check`; `make wireview-venv` makes the venv.) Starts build/nats-server and two
Django processes of examples/wireview (daphne; uvicorn with --server uvicorn) on free loopback
ports, opens the list on each in its own page of Debian's Chromium (driven by Playwright, with the
settings and helpers of examples/demo/browser_check.py) and waits until both components are live.
Then:

1. adds an item on process A and waits until it is on B's page; then one on B, seen on A;
2. ticks A's item off on B, seen on A; removes B's item on A, gone from B;
3. starts a third process, C, and opens its page: it must show the list as it is now, which it
   can only have from A and B through the layer (C asked for it when it started, replica.py).

Every change is timed from the click to the moment the other page shows it. Screenshots go to
build/wireview/. The browser is closed and every process stopped at the end, also on failure; a
Django process that does not stop cleanly fails the check. Every wait is bounded. Exits 0 when all
passed, 1 otherwise. --serve keeps everything running after the check, until Ctrl-C.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "demo"))

import demo as demo_module  # noqa: E402
from browser_check import TIMEOUT_MS, chromium, ensure_chromium, new_context  # noqa: E402
from demo import BUILD, SERVERS, Demo, DemoError, Service, Site, handle_stop_signals, say  # noqa: E402

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page

OUT = BUILD / "wireview"
SITE = Site(
    name="wireview",
    directory=HERE,
    settings="board.settings",
    asgi="board.asgi:application",
    ready_path="/",
    ready_text='id="todo-list"',
    path_entries=(HERE,),
    source_layer=False,  # channels_nats as installed in the venv, with the library inside it
    name_variable="WIREVIEW_PROCESS",
)
LIVE = 'section.board[data-live="yes"]'
"""The component once it has joined over its WebSocket (and so is subscribed to the topic)."""

# The latencies are measured in the pages, on the browser's clock (performance.timeOrigin is the
# same epoch in every page): from the click on one page to the mutation that shows its effect on
# the other. Playwright's own waits only bound them (its click returns after checks of its own).
STAMP_CLICKS = """
document.addEventListener("click", () => { window.__clickedAt = performance.timeOrigin + performance.now(); }, true);
"""
WATCH = """
({selector, text, present}) => {
  window.__seenAt = null;
  const holds = () => [...document.querySelectorAll(selector)].some((el) => el.textContent.includes(text)) === present;
  const observer = new MutationObserver(() => {
    if (holds()) { window.__seenAt = performance.timeOrigin + performance.now(); observer.disconnect(); }
  });
  observer.observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}
"""


@dataclass
class Tab:
    """A page of the list on one process."""

    service: Service
    page: Page

    @property
    def name(self) -> str:
        return self.service.name

    def item(self, text: str) -> Locator:
        return self.page.locator("#todo-list li", has_text=text)


def open_tab(browser: Browser, service: Service, errors: list[str]) -> Tab:
    """The list on `service` in a page of its own browser context: its own window, as a second user
    has (pages in one window are background tabs, whose animation frames, which wireview patches
    the page in, Chromium holds back)."""
    context = new_context(browser)
    context.add_init_script(STAMP_CLICKS)
    page = context.new_page()
    page.on("pageerror", lambda err: errors.append(f"{service.name}: {err}"))
    page.goto(f"{service.url}/")
    page.wait_for_function("window.__openSockets > 0")
    page.locator(LIVE).wait_for()
    say(f"page {service.url}/ is live: its component joined over the WebSocket ({service.name})")
    return Tab(service, page)


def change(
    what: str, source: Tab, click: Locator, target: Tab, selector: str, text: str, present: bool = True
) -> float:
    """Clicks `click` on the source page and waits until an element of `selector` holding `text` is
    there (present) or gone (not present) on the target page; returns the latency in milliseconds."""
    from playwright.sync_api import Error as PlaywrightError

    target.page.evaluate(WATCH, {"selector": selector, "text": text, "present": present})
    click.click()
    wait = target.page.locator(selector, has_text=text)
    try:
        wait.wait_for(state="visible" if present else "detached", timeout=TIMEOUT_MS)
        seen_at = target.page.wait_for_function("window.__seenAt", timeout=TIMEOUT_MS).json_value()
    except PlaywrightError as err:
        raise DemoError(
            f"{what} on {source.name} ({source.service.url}) did not show on {target.name} "
            f"({target.service.url}) within {TIMEOUT_MS / 1000:.0f} s"
        ) from err
    ms = float(seen_at) - float(source.page.evaluate("window.__clickedAt"))
    say(f"latency: {what} on {source.name}, seen on {target.name} {ms:.1f} ms after the click")
    return ms


def add(source: Tab, target: Tab, text: str) -> float:
    source.page.fill("#new-item", text)
    return change(f"added {text!r}", source, source.page.locator("#add-item"), target, "#todo-list li", text)


def run(demo: Demo, browser: Browser) -> list[str]:
    """The browser part; returns the result lines. Raises DemoError."""
    from playwright.sync_api import Error as PlaywrightError

    a, b = demo.djangos
    errors: list[str] = []
    results: list[str] = []
    tab_a, tab_b = open_tab(browser, a, errors), open_tab(browser, b, errors)

    first = f"milk from {a.name} {secrets.token_hex(3)}"
    ms = add(tab_a, tab_b, first)
    results.append(f"{a.name} -> {b.name}: an item added on {a.url} appeared on {b.url} {ms:.1f} ms after the click")
    second = f"bread from {b.name} {secrets.token_hex(3)}"
    ms = add(tab_b, tab_a, second)
    results.append(f"{b.name} -> {a.name}: an item added on {b.url} appeared on {a.url} {ms:.1f} ms after the click")
    tab_b.item(first).wait_for()  # B's page has A's item, and its own

    toggle = tab_b.item(first).locator("input.toggle")
    ms = change(f"ticked {first!r} off", tab_b, toggle, tab_a, "#todo-list li.done", first)
    results.append(f"{b.name} -> {a.name}: an item ticked off on {b.name} was ticked off on {a.name} after {ms:.1f} ms")
    remove = tab_a.item(second).locator("button.remove")
    ms = change(f"removed {second!r}", tab_a, remove, tab_b, "#todo-list li", second, present=False)
    results.append(f"{a.name} -> {b.name}: an item removed on {a.name} was gone from {b.name} after {ms:.1f} ms")

    say("starting a third process, which gets the list from the others through the layer when it starts")
    c = demo.start_django("C")
    demo.wait_django(c)
    tab_c = open_tab(browser, c, errors)
    if tab_c.item(second).count():
        raise DemoError(f"{c.name} shows {second!r}, which was removed before it started")
    try:
        tab_c.page.locator("#todo-list li.done", has_text=first).wait_for(timeout=1000)
    except PlaywrightError as err:
        raise DemoError(f"{c.name}, started after the changes, does not show {first!r} ticked off") from err
    results.append(f"{c.name}, started later, shows the list as A and B have it (from them, through NATS)")
    left = tab_c.page.locator("p.count").inner_text()
    say(f"{c.name} shows the list: {tab_c.page.locator('#todo-list li').count()} item(s), {left}")

    for tab in (tab_a, tab_b, tab_c):
        shot = demo.out / f"browser-{tab.name}.png"
        tab.page.screenshot(path=str(shot), full_page=True)
        say(f"screenshot {shot}")
    if errors:
        raise DemoError("JavaScript errors in the pages:\n  " + "\n  ".join(errors))
    return results


def serve(demo: Demo) -> None:
    print()
    print("The list is up. Open it on two processes side by side and change it on one:")
    for django in demo.djangos:
        print(f"  {django.name:<10} {django.url}/")
    print(f"  nats-server {demo.nats_url}   (logs: {demo.out}/)")
    print("Ctrl-C stops everything.", flush=True)
    while True:
        time.sleep(0.5)
        demo.check_alive()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=sorted(SERVERS), default="daphne", help="the ASGI server (default daphne)")
    parser.add_argument("--serve", action="store_true", help="after the check, serve until Ctrl-C")
    args = parser.parse_args()
    demo_module.SAY_PREFIX = "wireview"
    handle_stop_signals()
    started = time.monotonic()
    if sys.version_info < (3, 12):
        say(f"check FAILED: django-wireview needs Python 3.12 or later, this is {sys.version.split()[0]}: "
            "run it with build/wireview-venv/bin/python (make wireview-venv)")  # fmt: skip
        return 1
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        say(f"check FAILED: the Python package playwright is missing in {sys.executable}: make wireview-venv")
        return 1
    demo = Demo(
        gofront_port=None,
        server=args.server,
        site=SITE,
        modules=("channels", "django", "wireview", "channels_nats", "playwright"),
        install_hint="make wireview-venv",
        out=OUT,
    )
    try:
        ensure_chromium()
        # The Django processes stop first, with the pages still open: their shutdown closes live
        # wireview sockets, as a restart of a deployment does.
        with sync_playwright() as playwright, chromium(playwright) as browser, demo:
            demo.start()
            for line in run(demo, browser):
                print(f"proof: {line}", flush=True)
            if args.serve:
                say(f"check passed in {time.monotonic() - started:.1f} s")
                serve(demo)
        if problems := demo.shutdown_problems():
            raise DemoError("unclean shutdown:\n  " + "\n  ".join(problems))
        say(demo.shutdown_report())
    except PlaywrightError as err:
        say(f"check FAILED: Playwright: {err}")
        return 1
    except KeyboardInterrupt as stop:
        say(f"{stop.args[0] if stop.args else 'SIGINT'}: stopped")
        return 0 if args.serve else 1
    except DemoError as err:
        say(f"check FAILED: {err}")
        return 1
    say(f"check passed in {time.monotonic() - started:.1f} s ({args.server}, through NATS at {demo.nats_url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
