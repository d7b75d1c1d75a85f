#!/usr/bin/env python3
"""The browser test of the demo: headless Chromium types into the chat on one process and reads it on the others.

    build/venv/bin/python examples/demo/browser_check.py [--no-gofront | --require-gofront]

Starts the demo (nats-server, two Django processes, the Go front when it is there) on free ports,
opens the room "browser" on each front in its own page of Debian's Chromium (/usr/bin/chromium,
driven by Playwright's Python package; never a browser Playwright downloads), then, from each page
in turn, types a message, clicks Send and waits until it is in every page's #chat-log. Screenshots
go to build/demo/browser-<front>.png. Exits 0 when every message arrived, 1 otherwise.

Its browser helpers (ensure_chromium, chromium, new_context) are shared: examples/wireview/check.py
imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from demo import OUT, Demo, DemoError, Service, handle_stop_signals, say

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Playwright, ViewportSize

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-proxy-server",
]
ROOM = "browser"
TIMEOUT_MS = 10_000
"""The bound of every wait in a page."""
VIEWPORT: ViewportSize = {"width": 900, "height": 640}

# Counts the page's open WebSockets, whatever page it is (Django's or the Go front's): the test
# types only once every page is connected to its room.
COUNT_SOCKETS = """
(() => {
  const Native = window.WebSocket;
  window.__openSockets = 0;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("open", () => { window.__openSockets += 1; });
      this.addEventListener("close", () => { window.__openSockets -= 1; });
    }
  };
})();
"""


def ensure_chromium() -> None:
    """Installs Debian's chromium with apt-get when it is missing and we are root; else explains."""
    if CHROMIUM.exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise DemoError(f"{CHROMIUM} is missing: install Debian's chromium (sudo apt-get install -y chromium)")
    say("installing Debian's chromium (apt-get install -y chromium)")
    install = ["apt-get", "install", "-y", "-q", "chromium"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=False)
        subprocess.run(install, env=env, stdout=subprocess.DEVNULL, check=False)
    if not CHROMIUM.exists():
        raise DemoError(f"apt-get could not install chromium: {CHROMIUM} is still missing")


@contextlib.contextmanager
def chromium(playwright: Playwright) -> Iterator[Browser]:
    """Debian's Chromium, headless, with the settings of these checks; closed on the way out."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
    try:
        yield browser
    finally:
        browser.close()


def new_context(browser: Browser) -> BrowserContext:
    """A browser context whose pages count their open WebSockets in window.__openSockets, and whose
    waits are bounded by TIMEOUT_MS."""
    context = browser.new_context(viewport=VIEWPORT)
    context.add_init_script(COUNT_SOCKETS)
    context.set_default_timeout(TIMEOUT_MS)
    return context


def run(demo: Demo) -> None:
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import Page, sync_playwright  # imported here: main explains when it is missing

    fronts: list[Service] = demo.fronts()
    with sync_playwright() as playwright, chromium(playwright) as browser:
        pages: dict[str, Page] = {}
        errors: list[str] = []
        for front in fronts:
            # A context (a window) per front, as each user has: pages in one window are background
            # tabs, whose animation frames (and Playwright's waits on them) Chromium holds back.
            page = new_context(browser).new_page()
            page.on("pageerror", lambda err, name=front.name: errors.append(f"{name}: {err}"))
            url = f"{front.url}/chat/{ROOM}/"
            page.goto(url)
            page.wait_for_function("window.__openSockets > 0", timeout=TIMEOUT_MS)
            say(f"page {url} is open, its WebSocket connected ({front.name})")
            pages[front.name] = page

        for source in fronts:
            text = f"typed in Chromium on {source.name} {secrets.token_hex(4)}"
            page = pages[source.name]
            started = time.perf_counter()
            page.fill("#chat-message-input", text)
            page.click("#chat-message-submit")
            for target in fronts:
                try:
                    pages[target.name].locator("#chat-log li", has_text=text).wait_for(timeout=TIMEOUT_MS)
                except PlaywrightError as err:
                    raise DemoError(
                        f"{text!r}, typed on {source.url}, did not appear in #chat-log on {target.url} "
                        f"within {TIMEOUT_MS / 1000:.0f} s"
                    ) from err
                if target is not source:
                    ms = (time.perf_counter() - started) * 1000
                    say(f"browser: typed on {source.url}, seen on {target.url} within {ms:.0f} ms")

        for name, page in pages.items():
            shot = OUT / f"browser-{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            say(f"screenshot {shot}")
        if errors:
            raise DemoError("JavaScript errors in the pages:\n  " + "\n  ".join(errors))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--no-gofront", action="store_true", help="leave the Go front out")
    group.add_argument("--require-gofront", action="store_true", help="fail when the Go front cannot start")
    args = parser.parse_args()
    handle_stop_signals()
    started = time.monotonic()
    try:
        from playwright.sync_api import Error as PlaywrightError
    except ImportError:
        say("browser check FAILED: the Python package playwright is missing: make venv")
        return 1
    try:
        ensure_chromium()
        with Demo(gofront_port=None if args.no_gofront else 0, require_gofront=args.require_gofront) as demo:
            demo.start()
            run(demo)
    except PlaywrightError as err:
        say(f"browser check FAILED: Playwright: {err}")
        return 1
    except KeyboardInterrupt:
        say("browser check: interrupted")
        return 1
    except DemoError as err:
        say(f"browser check FAILED: {err}")
        return 1
    say(f"browser check passed in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
