"""Take docs/voice-demo.png: the voice demo's page after a spoken turn, run once by hand.

    python docs/voice_demo_shot.py

Runs ``vrt demo --web --voice --port 0`` as a user would, opens ``/voice?autorun`` in
Debian's Chromium with a fake microphone saying (espeak-ng) "what is the weather in
Paris", waits for the whole answer (the weather looked up, the card painted, "There it
is."), and saves the page. Prints the page's console errors (there should be none).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).parent.parent
OUT = ROOT / "docs" / "voice-demo.png"

DONE = """() => {
  const r = window.voiceResult;
  return r !== undefined && r.cards.some((c) => c.state === "shown")
    && r.transcript.some((t) => t.text.includes("is."))
    && r.turns.at(-1)?.reason === "finished";
}"""


def main() -> int:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium is not None, "Debian's chromium is needed"
    with tempfile.TemporaryDirectory() as tmp:
        said, wav = Path(tmp) / "said.wav", Path(tmp) / "mic.wav"
        subprocess.run(["espeak-ng", "-w", str(said), "what is the weather in Paris"], check=True)
        subprocess.run(["sox", str(said), "-r", "48000", "-c", "1", "-b", "16", str(wav),
                        "pad", "0.5", "30"], check=True)  # fmt: skip
        server = subprocess.Popen(
            [sys.executable, "-m", "vrt", "demo", "--web", "--voice", "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert server.stdout is not None
            page_url = ""
            while not page_url:
                line = server.stdout.readline()
                print(line, end="")
                if "voice demo is" in line:
                    page_url = line.split(" is ")[1].split()[0]
            with sync_playwright() as p:
                browser = p.chromium.launch(
                    executable_path=chromium,
                    args=[
                        "--no-sandbox",
                        "--use-fake-device-for-media-stream",
                        "--use-fake-ui-for-media-stream",
                        f"--use-file-for-fake-audio-capture={wav}",
                        "--autoplay-policy=no-user-gesture-required",
                    ],
                )
                page = browser.new_page(viewport={"width": 1100, "height": 420})
                errors: list[str] = []
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(page_url + "?autorun")
                page.wait_for_function(DONE, timeout=20_000)
                page.wait_for_timeout(400)
                page.screenshot(path=str(OUT), full_page=True)
                browser.close()
        finally:
            server.terminate()
            server.wait(timeout=10)
    print(f"saved {OUT}; console errors: {errors or 'none'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
