"""Helpers for the web console's tests (no tests here): ``stratamq console`` as a real
subprocess, and headless Debian chromium driven through chromium-driver and Selenium."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@dataclass
class ConsoleProcess:
    proc: subprocess.Popen
    url: str
    log: list[str] = field(default_factory=list)  # its stderr, drained (a full pipe blocks)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.proc.returncode


def start_console(endpoint: str, *extra: str) -> ConsoleProcess:
    """``stratamq console --endpoint ENDPOINT --listen 127.0.0.1:0 EXTRA...``; its URL is the
    line it prints on stderr once it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratamq.cli", "console", "--endpoint", endpoint, "--listen",
         "127.0.0.1:0", *extra], cwd=PROJECT, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    line = proc.stderr.readline()
    m = re.search(r"console on (http://\S+)", line)
    if not m:
        proc.kill()
        raise AssertionError(f"console did not start: {line!r} {proc.stderr.read()}")
    console = ConsoleProcess(proc, m.group(1))
    threading.Thread(target=lambda: console.log.extend(proc.stderr), daemon=True).start()
    return console


def browser() -> object:
    """Headless chromium whose console messages and network responses can be read back."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail("chromium and chromium-driver are not installed (make test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def problems(driver) -> list[str]:
    """JavaScript console errors and failed requests since the last call (a 4xx/5xx answer,
    a request that got none)."""
    found = [f"console: {e['message']}" for e in driver.get_log("browser")
             if e["level"] == "SEVERE"]
    for entry in driver.get_log("performance"):
        event = json.loads(entry["message"])["message"]
        params = event.get("params", {})
        if event["method"] == "Network.responseReceived":
            response = params["response"]
            if response["status"] >= 400:
                found.append(f"{response['status']} {response['url']}")
        elif event["method"] == "Network.loadingFailed" and not params.get("canceled"):
            found.append(f"failed: {params.get('errorText')} {params.get('requestId')}")
    return found


def post(url: str, fields: dict[str, str], *, csrf: bool = True) -> tuple[int, str]:
    """A form POST outside the browser: with the console's CSRF cookie and token (fetched
    from a page first) unless ``csrf`` is false. (status, body)"""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if csrf:
        with urllib.request.urlopen(url.split("/", 3)[0] + "//" + url.split("/", 3)[2]
                                    + "/topics", timeout=30) as page:
            cookie = page.headers["set-cookie"].split(";", 1)[0]
        token = cookie.split("=", 1)[1]
        headers["Cookie"] = cookie
        fields = {**fields, "csrf_token": token}
    request = urllib.request.Request(url, data=urllib.parse.urlencode(fields).encode(),
                                     headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
