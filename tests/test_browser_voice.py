"""The voice demo end to end in a real browser: Debian's Chromium, headless, its fake
microphone playing a recording made by espeak-ng, talking to the voice demo's page
(vrt/web/voice.html) served with the demo's agent on vrt.testing.FakeRealtime
(tests/voice_server.py: what ``vrt demo --web --voice`` serves, with the fake in reach).

The recording asks for the weather, then speaks again while the agent answers: the page's
own barge-in interrupts it. Everything timed in the page is read from its AudioContext
clock; what the model was told, from what the fake received.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_browser import CHROMIUM, ROOT, open_page, run_js
from vrt._cli import voice_agent
from vrt.models._scripted import Say
from vrt.testing._realtime_core import WORD_MS

pytestmark = pytest.mark.network  # a real browser: the first pass only, as tests/test_browser.py

QUESTION = "what is the weather in Paris"
BARGE_IN = "wait, stop, stop"
GAP_S = 1.6
"""Seconds between the question and the barge-in: the fake answers 0.5 s after the user
stops (its silence), says a short sentence (0.4 s), calls the weather tool, then a long
one (1.6 s) while the page paints the card: the barge-in falls in that."""


def recording(path: Path) -> Path:
    """The question, a gap, the barge-in, then silence (Chromium loops the file: long
    enough that the test is over first), 48 kHz mono PCM16."""
    assert shutil.which("espeak-ng") and shutil.which("sox"), "espeak-ng and sox are needed"
    parts = []
    for name, text in (("question", QUESTION), ("barge", BARGE_IN)):
        part = path.parent / f"{name}.wav"
        subprocess.run(["espeak-ng", "-w", str(part), text], check=True)
        parts.append(part)
    gap = path.parent / "gap.wav"
    subprocess.run(["sox", "-n", "-r", "22050", "-c", "1", "-b", "16", str(gap), "trim", "0",
                    str(GAP_S)], check=True)  # fmt: skip
    subprocess.run(["sox", str(parts[0]), str(gap), str(parts[1]), "-r", "48000", "-c", "1",
                    "-b", "16", str(path), "pad", "0.3", "15"], check=True)  # fmt: skip
    return path


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    """Chromium whose microphone is the recording, allowed without asking, audio playing
    without a user gesture."""
    from playwright.sync_api import sync_playwright

    assert CHROMIUM is not None, "Debian's chromium is needed (.ci/run installs it)"
    wav = recording(tmp_path / "mic.wav")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--use-fake-device-for-media-stream",
                "--use-fake-ui-for-media-stream",
                f"--use-file-for-fake-audio-capture={wav}",
                "--autoplay-policy=no-user-gesture-required",
            ],
        )
        yield browser
        browser.close()


class VoiceServer:
    """``python -m tests.voice_server``: its URL, then (:meth:`stop`) what the fake got."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.voice_server"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().decode().split(" on ")[1].strip()

    def stop(self) -> dict[str, Any]:
        try:
            out, err = self.process.communicate(b"", timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, err = self.process.communicate()
        errors = [x for x in err.decode().splitlines() if " ERROR " in x or "Traceback" in x]
        assert not errors, errors
        report: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
        return report


BARGE = """async () => {
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  while (!window.voiceResult?.ready) await wait(20);
  const r = window.voiceResult;
  const audio = window.voiceClient.audio;
  while (r.interrupts.length === 0) await wait(5);
  const cut = r.interrupts[0];
  while (!r.turns.some((t) => t.turnId === cut.turnId)) await wait(5);
  while (!r.cards.some((c) => c.state !== "painting")) await wait(5);
  await wait(300);
  const after = await audio.stats();  // (the next turn, after the barge-in's speech: later)
  return { result: JSON.parse(JSON.stringify({ ...r, ready: undefined })), after };
}"""

NEXT = """async ([turnId]) => {
  const wait = (ms) => new Promise((r) => setTimeout(r, ms));
  const r = window.voiceResult;
  while (!r.turns.some((t) => t.turnId !== turnId && t.reason === "finished"
                        && t.time > r.interrupts[0].time)) await wait(10);
  await wait(200);
  return { result: JSON.parse(JSON.stringify(r)), end: await window.voiceClient.audio.stats() };
}"""


def test_a_spoken_question_an_answer_and_a_barge_in(browser: Any) -> None:
    """The recording asks; the agent answers with its voice, the weather tool and the slow
    show_card; the recording barges in while it speaks: the voice stops within 50 ms of the
    page's interrupt, the card is cancelled in the page and the call INTERRUPTED on the
    server, the model's audio is truncated to within 50 ms of what the page played, and
    nothing of the interrupted turn plays after; the next utterance is a turn of its own."""
    began = time.monotonic()
    server = VoiceServer()
    try:
        page = open_page(browser, server.url)
        page.goto("http" + server.url[2:] + "voice?autorun")
        got = run_js(page, BARGE, None, within=20)
        later = run_js(page, NEXT, [got["result"]["interrupts"][0]["turnId"]], within=10)
        console = page.console
        page.close()
    finally:
        fake = server.stop()
    took = time.monotonic() - began
    assert not [c for c in console if c.startswith(("error", "pageerror"))], console
    assert fake["violations"] == []
    result, after, end = got["result"], got["after"], later["end"]
    assert result["errors"] == []
    [cut] = later["result"]["interrupts"]  # the barge-in, once
    turn = cut["turnId"]
    assert cut["why"] == "barge-in" and turn is not None, cut
    said = {(t["role"], t["turnId"]) for t in later["result"]["transcript"]}
    assert ("user", turn) in said and ("agent", turn) in said

    # the voice is silent within 50 ms of the interrupt, by the AudioContext's clock
    quantum = 128 / after["sampleRate"]
    assert after["interruptTime"] == cut["time"]
    assert after["flushTime"] - cut["time"] < 0.05
    assert after["lastSoundTime"] < after["flushTime"] + quantum
    silent_after = after["lastSoundTime"] - cut["time"]
    assert silent_after < 0.05, silent_after
    assert after["queuedMs"] == 0

    # the slow app call: cancelled in the page, INTERRUPTED on the server (the turn too)
    assert result["turns"][0] == {**result["turns"][0], "turnId": turn, "reason": "interrupted"}
    calls = {c["name"]: c for c in result["calls"].values()}
    assert calls["weather"]["phases"][-1] == "settled"
    assert calls["show_card"]["phases"][-1] == "cancelled"
    assert [c["state"] for c in result["cards"]] == ["cancelled"]
    card_id = next(k for k, c in result["calls"].items() if c["name"] == "show_card")
    answers = {m["item"]["call_id"]: json.loads(m["item"]["output"]) for m in fake["sent"]
               if m["type"] == "conversation.item.create"
               and m["item"]["type"] == "function_call_output"}  # fmt: skip
    assert answers[card_id]["code"] == "INTERRUPTED", answers

    # the model is told what the page played: the truncate of the answer's audio item
    # (the turn's second: after the first response's words) is within 50 ms of it
    [truncate] = [m for m in fake["sent"] if m["type"] == "conversation.item.truncate"]
    first = voice_agent.steps()[0][0]
    assert isinstance(first, Say)
    before = len(first.text.split()) * WORD_MS
    played = after["turns"][turn]["playedMs"]
    off = truncate["audio_end_ms"] + before - played
    assert abs(off) <= 50, (truncate, before, played)
    assert cut["heardMs"] <= played  # what vrt.js sent: read just before the interrupt

    # nothing of the interrupted turn played after it; the next utterance is a new turn
    assert end["turns"][turn] == after["turns"][turn]
    assert end["turns"][turn]["playedMs"] < end["turns"][turn]["receivedMs"]
    [(nxt, stats)] = [(t, s) for t, s in end["turns"].items() if t != turn]
    assert stats["playedMs"] > 0 and stats["droppedMs"] == 0
    assert {"turnId": nxt, "reason": "finished"}.items() <= later["result"]["turns"][-1].items()
    assert took < 30
    print(
        f"\nsilent {silent_after * 1000:.2f} ms after the page's barge-in (flush at "
        f"+{(after['flushTime'] - cut['time']) * 1000:.2f} ms); truncate audio_end_ms "
        f"{truncate['audio_end_ms']} + {before} ms before its item vs {played:.2f} ms played: "
        f"{off:+.2f} ms; heardMs {cut['heardMs']}; context {after['sampleRate']} Hz; "
        f"test {took:.1f} s"
    )


def test_vrt_demo_web_voice_serves_the_page(browser: Any) -> None:
    """As a new user: ``vrt demo --web --voice`` prints the page's URL; the page loads,
    connects with audio-v1 and says so, with no console error, before anyone talks."""
    command = [sys.executable, "-m", "vrt", "demo", "--web", "--voice", "--port", "0"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline().decode() for _ in range(3)]
        [url] = [line.split(" is ")[1].split()[0] for line in lines if "voice demo is" in line]
        assert url.endswith("/voice"), lines
        page = open_page(browser, "ws" + url[4:-5])
        page.goto(url)
        page.wait_for_function("() => window.voiceResult?.ready === true", timeout=10_000)
        status = page.text_content("#status") or ""
        assert "audio-v1" in status and page.is_enabled("#talk"), status
        assert not [c for c in page.console if c.startswith(("error", "pageerror"))], page.console
        page.close()
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert "Traceback" not in err.decode() and " ERROR " not in err.decode(), err.decode()
