"""The web page in real headless Chromium (Debian's `chromium` driven by Playwright; `make browser`
installs it) against a real uvicorn process serving a tiny checkpoint: upload, Continue, piano roll,
download, errors."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pretty_midi
import pytest

from server.settings import STATIC_DIR
from tests.conftest import REPO, SHARED_MIDI
from tests.server.conftest import GENERATION_TIMEOUT_MS, start_server


def test_every_module_is_served_as_javascript(live_server):
    """A browser runs a module script only when it comes with a JavaScript MIME type (no sniffing)."""
    modules = sorted((STATIC_DIR / "js").rglob("*.js"))
    assert modules
    with httpx.Client(base_url=live_server) as client:  # httpx.get costs an SSL context (60 ms) a file
        for path in modules:
            response = client.get(f"/static/{path.relative_to(STATIC_DIR).as_posix()}")
            assert response.status_code == 200, path.name
            mime = response.headers["content-type"].split(";")[0].strip()
            assert mime in ("text/javascript", "application/javascript"), (path.name, mime)
            assert response.content == path.read_bytes()


def _set_fast_settings(page) -> None:
    page.fill("#seconds", "2")
    page.fill("#num_samples", "1")
    page.fill("#seed", "7")


def test_upload_continue_draws_the_roll_and_downloads_a_midi_file(page, motif_file):
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    assert "notes" in page.inner_text("#motif-info")
    _set_fast_settings(page)
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)

    assert page.is_visible("#download")
    assert page.is_enabled("#continue"), "the button must be usable again after a result"
    assert page.inner_text("#info-seed").strip() == "7"
    assert "decode" in page.inner_text("#info-timings")
    assert "Done in" in page.inner_text("#status") and "instruments model" not in page.inner_text("#status")
    label = page.get_attribute("#roll", "aria-label")
    assert "motif of" in label and "continuation" in label
    drawn = page.evaluate(
        """() => {
          const c = document.getElementById('roll');
          const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          let differing = 0;
          for (let i = 0; i < px.length; i += 4) {
            const d = Math.abs(px[i] - px[0]) + Math.abs(px[i + 1] - px[1]) + Math.abs(px[i + 2] - px[2]);
            if (d > 60) differing++;
          }
          return differing;
        }"""
    )
    assert drawn > 500, "the piano roll canvas stayed (almost) blank"

    # WebAudio playback: the playhead runs over the roll and Stop silences every scheduled voice.
    page.click("#play-all")
    page.wait_for_function("window.musicrel.roll.playhead > 0.2", timeout=5000)
    assert page.evaluate("window.musicrel.synth.nodes.size") > 0
    page.click("#stop")
    assert page.evaluate("[window.musicrel.synth.nodes.size, window.musicrel.roll.playhead]") == [0, None]

    with page.expect_download() as info:
        page.click("#download")
    download = info.value
    assert download.suggested_filename.endswith(".mid")
    data = Path(download.path()).read_bytes()
    assert data[:4] == b"MThd"
    pm = pretty_midi.PrettyMIDI(io.BytesIO(data))
    # The page counts the notes of the downloaded file itself: both must agree.
    assert sum(len(i.notes) for i in pm.instruments) == int(page.get_attribute("#roll", "data-notes"))


def test_non_midi_upload_shows_the_api_error_in_words(page):
    fake = {"name": "notes.mid", "mimeType": "audio/midi", "buffer": b"not a midi"}
    page.set_input_files("#file", files=[fake])
    page.wait_for_function("!document.getElementById('continue').disabled")
    _set_fast_settings(page)
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    error = page.inner_text("#error")
    assert page.is_visible("#error")
    assert "not_midi" in error, error
    assert len(error) > len("Error: (not_midi)") + 10, f"no message in words: {error!r}"
    assert page.is_enabled("#continue"), "the button must be re-enabled after an error"
    assert not page.is_visible("#download")


def test_out_of_bounds_setting_is_refused_before_sending(page, motif_file):
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    page.fill("#top_p", "1.5")
    page.click("#continue")
    assert "Top-p" in page.inner_text("#error")
    assert page.get_attribute("#app", "data-state") != "loading"


@pytest.mark.filterwarnings("ignore:Tempo, Key or Time signature:RuntimeWarning")  # one shared file has them
def test_example_list_and_parser_agree_with_pretty_midi(page, motif_file):
    """Every bundled example is offered, and the page's own SMF parser reads the same notes as pretty_midi
    (which the server's codec uses), so the roll shows what the model hears."""
    page.wait_for_function("document.querySelectorAll('#example option').length > 1")
    offered = page.eval_on_selector_all("#example option", "opts => opts.map(o => o.value).filter(Boolean)")
    assert sorted(offered) == sorted(p.name for p in (STATIC_DIR / "examples").glob("*.mid"))

    # The five smallest shared files (piano, POP909, multitrack pop with drums) keep this test quick.
    shared = sorted((SHARED_MIDI / "real").glob("*.mid"), key=lambda p: p.stat().st_size)[:5]
    for path in [*sorted((STATIC_DIR / "examples").glob("*.mid")), motif_file, *shared]:
        notes = page.evaluate(
            """b64 => {
              const bin = atob(b64), bytes = new Uint8Array(bin.length);
              for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
              const notes = window.musicrel.parseMidi(bytes.buffer).notes;
              return notes.map(n => [n.start, n.end, n.pitch, n.velocity]);
            }""",
            base64.b64encode(path.read_bytes()).decode(),
        )
        pm = pretty_midi.PrettyMIDI(str(path))
        expected = sorted((n.start, n.end, n.pitch, n.velocity) for i in pm.instruments for n in i.notes)
        got = np.array(sorted(map(tuple, notes))).reshape(-1, 4)
        want = np.array(expected).reshape(-1, 4)
        assert got.shape == want.shape, f"{path.name}: page {len(got)} notes, pretty_midi {len(want)}"
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=path.name)


def test_example_pick_then_narrow_screen_has_no_horizontal_scroll(page):
    page.set_viewport_size({"width": 360, "height": 800})
    page.wait_for_function("document.querySelectorAll('#example option').length > 1")
    page.select_option("#example", index=1)
    page.wait_for_function("!document.getElementById('continue').disabled")
    assert page.inner_text("#motif-info").startswith("Example:")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


def test_drag_and_drop_loads_the_motif(page, motif_file):
    page.evaluate(
        """async b64 => {
          const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
          const dt = new DataTransfer();
          dt.items.add(new File([bytes], 'dropped.mid', { type: 'audio/midi' }));
          const zone = document.getElementById('dropzone');
          const init = { dataTransfer: dt, bubbles: true, cancelable: true };
          zone.dispatchEvent(new DragEvent('dragover', init));
          zone.dispatchEvent(new DragEvent('drop', init));
        }""",
        base64.b64encode(motif_file.read_bytes()).decode(),
    )
    page.wait_for_function("!document.getElementById('continue').disabled")
    info = page.inner_text("#motif-info")
    assert info.startswith("Dropped: dropped.mid"), info
    assert not page.eval_on_selector("#dropzone", "z => z.classList.contains('dragover')")


def test_a_tiny_file_is_shown_in_bytes(page):
    fake = {"name": "six.mid", "mimeType": "audio/midi", "buffer": b"MThd\x00\x00"}
    page.set_input_files("#file", files=[fake])
    page.wait_for_function("!document.getElementById('continue').disabled")
    info = page.inner_text("#motif-info")
    assert "(6 bytes)" in info and "KB" not in info, info


def test_docs_render_from_the_footer_link_with_no_internet(browser, live_server):
    """Every request that leaves the loopback is refused, as on a machine with no internet: the page's
    footer link still opens Swagger UI with the API in it."""
    context = browser.new_context()
    blocked: list[str] = []

    def only_loopback(route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "http://localhost")):
            route.continue_()
        else:
            blocked.append(url)
            route.abort()

    context.route("**/*", only_loopback)
    page = context.new_page()
    try:
        page.goto(f"{live_server}/")
        page.click("a[href='/docs']")
        page.wait_for_selector(".swagger-ui .info .title", timeout=15_000)
        assert "musicrel" in page.inner_text(".swagger-ui .info .title")
        page.wait_for_selector(".opblock-summary-path[data-path='/v1/continuations']", timeout=5_000)
        assert blocked == [], f"the docs reached outside the machine: {blocked}"
    finally:
        context.close()


# ---- steering -------------------------------------------------------------------------------------

C_MAJOR = {0, 2, 4, 5, 7, 9, 11}


def test_steer_key_only_range_and_instrument_hold_in_the_streamed_notes(page, motif_file):
    """The Steer section's key "only", range and instrument reach the model: every note heard live and every
    note of the result is in C major, in 60-72, and played by the chosen program."""
    from musicrel.generation.controls import gm_program_names

    page.wait_for_function("document.querySelectorAll('#program option').length > 1")
    names = page.eval_on_selector_all("#program option", "os => os.slice(1).map(o => o.textContent)")
    assert names == [f"{i} {name}" for i, name in enumerate(gm_program_names())]
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    _set_fast_settings(page)
    page.fill("#seconds", "4")
    page.click("#steer summary")
    page.select_option("#program", "40")
    page.select_option("#key", "C:major")
    page.select_option("#key_strength", "only")
    page.fill("#low_note", "60")
    page.fill("#high_note", "72")
    assert "C4" in page.inner_text("#low_note-hint")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    assert page.get_attribute("#app", "data-transport") == "stream"
    settings = page.evaluate("window.musicrel.state.response.settings")
    assert settings["key"] == "C:major" and settings["key_strength"] == "only"
    assert (settings["low_note"], settings["high_note"], settings["program"]) == (60, 72, 40)
    live = page.evaluate("window.musicrel.state.stream.liveNotes.map(n => n.pitch)")
    result = page.evaluate("window.musicrel.state.samples[0].contNotes.map(n => [n.pitch, n.program])")
    assert live and result, "no notes generated"
    assert sorted(live) == sorted(p for p, _ in result)  # what was heard is what was written
    assert all(60 <= p <= 72 and p % 12 in C_MAJOR for p in live), live
    assert {program for _, program in result} == {40}


def test_an_unknown_chord_shows_its_error_next_to_the_chord_field(page, motif_file):
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    _set_fast_settings(page)
    page.click("#steer summary")
    page.fill("#chords", "C:1 H7:1")
    page.click("#steer summary")  # folded again: the error must open it
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    assert page.evaluate("document.getElementById('steer').open")
    note = page.inner_text("#chords-error")
    assert page.is_visible("#chords-error") and "H7" in note, note
    # Beside the chord field, not somewhere else on the page.
    beside = "document.getElementById('chords-error').closest('.field')"
    beside += ".contains(document.getElementById('chords'))"
    assert page.evaluate(beside)
    assert page.get_attribute("#chords", "aria-invalid") == "true"
    assert "unknown_chord" in page.inner_text("#error")
    for other in ("key", "low_note", "density"):
        assert page.get_attribute(f"#{other}", "aria-invalid") is None
    page.fill("#chords", "C:1 G7:1")  # editing the field takes the complaint away
    assert not page.is_visible("#chords-error")
    assert page.get_attribute("#chords", "aria-invalid") is None


def test_steer_open_on_a_narrow_screen_has_no_horizontal_scroll(page):
    page.set_viewport_size({"width": 360, "height": 800})
    page.click("#steer summary")
    assert page.is_visible("#chords") and page.is_visible("#max_polyphony")
    assert page.evaluate("document.documentElement.scrollWidth") <= 360


# ---- streaming ------------------------------------------------------------------------------------

SHIPPED = REPO / "checkpoints" / "default"
# The goal: 300 ms from the click to the first note heard (docs/log/api.md has the measurements).
FIRST_NOTE_GOAL_MS = 300.0
# The motif is prepared (POST /v1/motifs) when it is chosen, so its first Continue is a re-roll in all but the
# first request's connection set-up; the bound leaves room for this loaded machine (docs/log/api.md).
FIRST_CONTINUE_BOUND_MS = 600.0
# A first Continue and two re-rolls a file (the re-rolls' median is their mean); five cost the suite 40 s.
LATENCY_RUNS = 3
# Long enough that generating it takes several times the first note's latency: on this 2-core machine 6 s
# took 1.9-4.1 s to generate (load average 3-6), the first note heard at 180-330 ms; 20 s (8-20 s each)
# cost the suite 40 s more for the same check.
LATENCY_SECONDS = 6


def _stream_timeline(page) -> dict:
    """The last Continue's timeline, in ms after the click (see state.stream in app.js)."""
    return page.evaluate(
        """() => {
          const s = window.musicrel.state.stream, at = (k) => (s[k] == null ? null : s[k] - s.clickAt);
          return { transport: s.transport, notes: s.notes, headers: at('headersAt'), start: at('startAt'),
                   first_note: at('firstNoteAt'), scheduled: at('scheduledAt'), heard: at('soundsAt'),
                   result: at('resultAt'), fallback: s.fallbackReason || null,
                   slips: window.musicrel.synth.live ? window.musicrel.synth.live.slips : null };
        }"""
    )


def test_continue_streams_and_falls_back_to_the_plain_endpoint(page, motif_file):
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    _set_fast_settings(page)
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    streamed = _stream_timeline(page)
    assert page.get_attribute("#app", "data-transport") == "stream"
    assert streamed["notes"] > 0 and streamed["first_note"] <= streamed["result"]
    # The live roll drew the notes the result then shows, no more and no fewer.
    assert page.get_attribute("#roll", "data-live-notes") == page.get_attribute("#roll", "data-notes")
    first_midi = page.evaluate("Array.from(window.musicrel.state.samples[0].bytes)")

    # A proxy that cuts the stream: the page asks the plain endpoint. The seed stays the one that gave notes
    # above: a random seed can draw a 2 s continuation with no note from the tiny random model (seen in CI).
    page.route("**/v1/continuations/stream", lambda route: route.abort())
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    assert page.get_attribute("#app", "data-transport") == "plain"
    assert "stream request failed" in _stream_timeline(page)["fallback"]
    assert page.is_visible("#download") and int(page.get_attribute("#roll", "data-notes")) > 0
    assert first_midi  # the streamed result was a real file too


def test_a_stream_error_event_is_shown_in_words(page, motif_file):
    """An error after the stream started (here a deadline, faked by the route) is the API's error: shown,
    not retried on the plain endpoint."""
    start = {
        "type": "start",
        "seed": 1,
        "settings": {},
        "primer": {"start_time": 0, "end_time": 1},
        "samples": 1,
    }
    error = {
        "type": "error",
        "status": 504,
        "error": {"code": "timeout", "message": "it did not finish in time"},
    }
    lines = "".join(json.dumps(e) + "\n" for e in (start, error))
    page.route(
        "**/v1/continuations/stream",
        lambda route: route.fulfill(status=200, content_type="application/x-ndjson", body=lines),
    )
    page.set_input_files("#file", str(motif_file))
    page.wait_for_function("!document.getElementById('continue').disabled")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    assert "timeout" in page.inner_text("#error") and "did not finish in time" in page.inner_text("#error")
    assert _stream_timeline(page)["transport"] == "stream"


@pytest.fixture(scope="module")
def shipped_server(tmp_path_factory):
    if not (SHIPPED / "model.safetensors").is_file():
        pytest.skip(f"the shipped checkpoint is not at {SHIPPED}")
    with start_server(SHIPPED, tmp_path_factory.mktemp("shipped")) as server:
        yield server.url


def _latency_runs(page, path: Path, runs: int) -> list[dict]:
    """Load `path`, then press Continue `runs` times with new seeds: the first is the motif's first
    Continue (parsed and prefilled), the others re-rolls (the server keeps both)."""
    page.set_input_files("#file", str(path))
    page.wait_for_function("!document.getElementById('continue').disabled")
    # As a person does: the motif is prepared while they look at it (a second or two) before Continue.
    page.wait_for_function("window.musicrel.state.preparedInfo", timeout=GENERATION_TIMEOUT_MS)
    prepared = page.evaluate("window.musicrel.state.preparedInfo")
    assert prepared["cached"] is False and prepared["prefill_ms"] is not None
    # The audio device is opened when the motif is chosen: opening it after Continue held the page 60-120 ms
    # before it read the stream's first bytes.
    assert page.evaluate("window.musicrel.synth.ctx !== null")
    print(
        f"\nprepared {path.name}: {prepared['ms']:.0f} ms on the page (parse {prepared['parse_ms']:.0f}, "
        f"prefill {prepared['prefill_ms']:.0f})"
    )
    page.fill("#seconds", str(LATENCY_SECONDS))
    out = []
    for seed in range(runs):
        page.fill("#seed", str(seed))
        page.click("#continue")
        page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
        timeline = _stream_timeline(page)
        server = page.evaluate("window.musicrel.state.response")
        timeline |= {k: server["timings"].get(k) for k in ("parse_ms", "queue_ms", "prefill_ms")}
        if seed == 0:  # the prepared motif: neither parsed nor prefilled again
            assert timeline["parse_ms"] < 20 and timeline["prefill_ms"] < 20, timeline
        timeline["server_first_note"] = server["first_note_ms"]
        out.append(timeline)
        # Stop what still plays: a 6 s continuation may have played out by the time it is done on a loaded
        # machine, and then Stop is disabled (a click on it would wait for it).
        page.evaluate("document.getElementById('stop').click()")
    return out


@pytest.mark.long(20)  # with the shipped model's server
def test_first_note_latency_on_the_shipped_model(browser, shipped_server, motif_file, record_property):
    """Click on Continue to the first generated note heard (its audio onset on the page's clock, output
    latency included), on the shipped model: a bundled example and a dense real file, each pressed once and
    then re-rolled. The page's marks (performance.now()) and the server's timings are printed per run."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    columns = ["headers", "first_note", "heard", "result", "server_first_note", "parse_ms", "queue_ms"]
    columns += ["prefill_ms"]
    measured = {}
    try:
        page.goto(f"{shipped_server}/")
        for path in (STATIC_DIR / "examples" / "piano_theme_c.mid", motif_file):
            runs = _latency_runs(page, path, LATENCY_RUNS)
            assert all(r["transport"] == "stream" for r in runs)
            print(f"\nfirst-note latency on {path.name}, ms after the click (run 0: first Continue):")
            for r in runs:
                print("  " + ", ".join(f"{c}={r[c]:.1f}" for c in columns) + f", slips={r['slips']}")
            measured[path.name] = {
                "first": runs[0],
                "rerolls": {c: float(np.median([r[c] for r in runs[1:]])) for c in columns},
            }
            print(f"  re-roll median: {measured[path.name]['rerolls']}")
    finally:
        context.close()
    record_property("first_note_latency_ms", measured)
    for name, m in measured.items():
        # Played while generating: the first note sounds before half the continuation is generated.
        assert m["rerolls"]["heard"] < m["rerolls"]["result"] / 2, (name, m["rerolls"])
        assert m["rerolls"]["heard"] <= FIRST_NOTE_GOAL_MS, (name, m["rerolls"])
        assert m["first"]["heard"] <= FIRST_CONTINUE_BOUND_MS, (name, m["first"])


# ---------------------------------------------------------------- Accompany mode
