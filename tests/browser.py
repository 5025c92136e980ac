"""What every browser test shares: the system's Chromium (never a downloaded browser build), Playwright, the marks
that skip a module (saying why) when either is missing, and one browser per module.

    from tests.browser import BROWSER_MARKS, CHROMIUM, sync_playwright  # the browser fixture is in conftest.py
    pytestmark = BROWSER_MARKS
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = next((p for p in (os.environ.get("EXPLAINQ_CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium") if p and Path(p).is_file()), None)
try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the marks below skip, saying why
    expect = sync_playwright = None

BROWSER_MARKS = [
    pytest.mark.skipif(sync_playwright is None, reason="playwright is not installed (pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None, reason="no system Chromium found (apt-get install chromium, or set "
                       "EXPLAINQ_CHROMIUM to its path); the browser tests need it"),
]


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module's tests."""
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()
