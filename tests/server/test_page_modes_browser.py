"""The page's Accompany and Fill modes in headless Chromium against a live server (the Continue mode and the
page as a whole: test_page_browser.py)."""

from __future__ import annotations

from pathlib import Path

import pretty_midi
import pytest

from tests.server.conftest import GENERATION_TIMEOUT_MS


def _melody_file(tmp_path: Path, chords: bool = False) -> Path:
    """A two-track file: a tune named MELODY (triads at every onset when `chords`) and a bass line."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    tune = pretty_midi.Instrument(program=73, name="MELODY")
    for k in range(12):
        start = 0.5 + 0.4 * k
        for interval in (0, 4, 7) if chords else (0,):
            tune.notes.append(pretty_midi.Note(90, 64 + (k * 5) % 12 + interval, start, start + 0.3))
    bass = pretty_midi.Instrument(program=32, name="BASS")
    bass.notes = [pretty_midi.Note(70, 40, 0.5 + 0.8 * k, 1.2 + 0.8 * k) for k in range(6)]
    pm.instruments += [bass, tune]  # the melody second: the page must find it by its name
    path = tmp_path / ("chords.mid" if chords else "melody.mid")
    pm.write(str(path))
    return path


# Pixels of the roll in each track's colour (style.css's --track-N for the slots asked), matched by hue at any
# velocity's transparency over the light background; the greys of the grid, the pale span band and the
# playhead's red are none of them.
TRACK_PIXELS = """slots => {
  const css = getComputedStyle(document.documentElement);
  const hex = (v) => css.getPropertyValue(v).trim().match(/\\w\\w/g).map((h) => parseInt(h, 16));
  const hsv = (r, g, b) => {
    const max = Math.max(r, g, b), d = max - Math.min(r, g, b);
    let h = !d ? 0 : max === r ? ((g - b) / d) % 6 : max === g ? (b - r) / d + 2 : (r - g) / d + 4;
    return [(h * 60 + 360) % 360, max ? d / max : 0];
  };
  const hues = slots.map((k) => hsv(...hex(`--track-${k}`))[0]);
  const c = document.getElementById('roll');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const counts = slots.map(() => 0);
  for (let i = 0; i < px.length; i += 4) {
    const [h, s] = hsv(px[i], px[i + 1], px[i + 2]);
    if (s < 0.3) continue;
    hues.forEach((t, k) => { if (Math.min(Math.abs(h - t), 360 - Math.abs(h - t)) < 8) counts[k]++; });
  }
  return counts;
}"""

# Pixels of the new notes' outline (--text) strictly inside the span band (its edges are drawn in --text too).
OUTLINE_IN_SPAN = """() => {
  const css = getComputedStyle(document.documentElement);
  const [r, g, b] = css.getPropertyValue('--text').trim().match(/\\w\\w/g).map((h) => parseInt(h, 16));
  const roll = window.musicrel.roll, v = roll.view, c = document.getElementById('roll');
  const x = (t) => v.left + (t / v.tEnd) * v.pw;
  const dpr = window.devicePixelRatio || 1;
  const x0 = Math.ceil((x(roll.span.start) + 2) * dpr), x1 = Math.floor((x(roll.span.end) - 2) * dpr);
  const y0 = Math.ceil(v.top * dpr), y1 = Math.floor((v.top + v.ph) * dpr);
  const px = c.getContext('2d').getImageData(x0, y0, x1 - x0, y1 - y0).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) {
    if (Math.abs(px[i] - r) + Math.abs(px[i + 1] - g) + Math.abs(px[i + 2] - b) < 40) n++;
  }
  return n;
}"""

LEGEND = """() => [...document.querySelectorAll('#track-legend li')].map((li) => [li.textContent,
  getComputedStyle(li.querySelector('.swatch')).backgroundColor, li.dataset.drum === 'true'])"""


def _accompany_mode(page) -> None:
    page.wait_for_function("!document.getElementById('mode-accompany').disabled")
    page.check("#mode-accompany")
    assert page.inner_text("#continue").strip() == "Accompany"
    assert not page.is_visible("#seconds") and not page.is_visible("#primer_seconds")
    assert page.is_visible("#track")


def test_each_mode_shows_its_own_sampling_defaults_unless_the_user_changed_them(page):
    """The accompaniment keeps the nucleus (measured better with it) where continuations measured better
    without: the shared top-p field follows the mode, from the server's defaults, and a value typed stays."""
    from musicrel.generation.melody import AccompanimentParams
    from musicrel.generation.sampling import SamplingParams

    assert page.input_value("#top_p") == "1.0"  # the page's own value, the continuation's default
    _accompany_mode(page)
    assert float(page.input_value("#top_p")) == AccompanimentParams.top_p
    page.check("#mode-continue")
    assert float(page.input_value("#top_p")) == SamplingParams.top_p
    page.fill("#top_p", "0.8")
    _accompany_mode(page)
    assert page.input_value("#top_p") == "0.8"


def test_accompany_mode_draws_melody_and_accompaniment_in_two_colours_and_plays_them(page, tmp_path):
    _accompany_mode(page)
    page.set_input_files("#file", str(_melody_file(tmp_path)))
    page.wait_for_function("!document.getElementById('continue').disabled")
    # The menu numbers the instruments as the server does, and picks the one named like a melody.
    assert page.eval_on_selector_all("#track option", "os => os.map(o => o.value)") == ["0", "1"]
    assert page.input_value("#track") == "1"
    # The melody alone before Accompany, in its track's colour (the second instrument: the second colour).
    bass, melody = page.evaluate(TRACK_PIXELS, [0, 1])
    assert melody > 100 and bass == 0, (bass, melody)
    assert [text for text, _, _ in page.evaluate(LEGEND)] == ["MELODY · Flute"]
    page.fill("#seed", "7")
    page.fill("#num_samples", "1")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)

    sample = page.evaluate(
        "(() => { const s = window.musicrel.state.samples[0]; "
        "return [s.motifNotes.length, s.contNotes.length]; })()"
    )
    assert sample[0] == 12, "the melody comes back with its 12 notes"
    assert sample[1] > 0, "the tiny model wrote no accompaniment"
    assert page.inner_text("#info-seed").strip() == "7"
    assert "melody" in page.get_attribute("#roll", "aria-label")
    assert page.inner_text("#legend-cont").strip() == "accompaniment"
    melody, accompaniment = page.evaluate(TRACK_PIXELS, [1, 2])
    assert melody > 100 and accompaniment > 50, f"both tracks in their colours: {melody}, {accompaniment}"
    legend = page.evaluate(LEGEND)
    assert [text for text, _, _ in legend] == ["MELODY · Flute", "accompaniment · Acoustic Grand Piano"]
    assert legend[0][1] != legend[1][1]

    # Played together as soon as it came: the playhead runs and voices are scheduled.
    page.wait_for_function("window.musicrel.roll.playhead > 0.2", timeout=5000)
    assert page.evaluate("window.musicrel.synth.nodes.size") > 0
    page.click("#stop")
    assert page.evaluate("window.musicrel.synth.nodes.size") == 0

    with page.expect_download() as info:
        page.click("#download")
    pm = pretty_midi.PrettyMIDI(info.value.path())
    assert [i.name for i in pm.instruments] == ["MELODY", "accompaniment"]
    assert len(pm.instruments[1].notes) == sample[1]

    # Back to Continue: its fields return and its button says so.
    page.check("#mode-continue")
    assert page.inner_text("#continue").strip() == "Continue"
    assert page.is_visible("#seconds") and not page.is_visible("#track")


def test_accompany_mode_shows_a_melody_with_chords_as_an_error_beside_the_track(page, tmp_path):
    _accompany_mode(page)
    page.set_input_files("#file", str(_melody_file(tmp_path, chords=True)))
    page.wait_for_function("!document.getElementById('continue').disabled")
    page.fill("#seed", "7")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    error = page.inner_text("#error")
    assert "melody_has_chords" in error and "not a melody" in error, error
    assert page.is_visible("#track-error")
    assert page.get_attribute("#track", "aria-invalid") == "true"
    assert page.is_enabled("#continue")


# ---------------------------------------------------------------- Fill: a span regenerated (POST /v1/infills)
def _fill_file(tmp_path: Path) -> Path:
    """One piano line, a note every 0.3 s for 12 s."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=100)
    piano = pretty_midi.Instrument(program=0, name="piano")
    piano.notes = [pretty_midi.Note(85, 60 + (k * 5) % 12, 0.3 * k, 0.3 * k + 0.25) for k in range(40)]
    pm.instruments.append(piano)
    path = tmp_path / "line.mid"
    pm.write(str(path))
    return path


def _fill_mode(page, tmp_path) -> Path:
    page.wait_for_function("!document.getElementById('mode-fill').disabled")
    page.check("#mode-fill")
    assert page.inner_text("#continue").strip() == "Fill"
    assert not page.is_visible("#seconds") and page.is_visible("#steer") and not page.is_visible("#track")
    path = _fill_file(tmp_path)
    page.set_input_files("#file", str(path))
    page.wait_for_function("!document.getElementById('continue').disabled")
    return path


def _span_notes(page) -> list:
    return page.evaluate(
        "(() => { const s = window.musicrel.state.samples[0]; "
        "return [s.motifNotes.length, s.contNotes.map(n => [n.start, n.end])]; })()"
    )


def test_fill_mode_drags_a_span_fills_it_plays_it_in_place_and_rerolls(page, tmp_path):
    path = _fill_mode(page, tmp_path)
    # A first span is offered in the middle of the music, marked on the roll.
    assert float(page.input_value("#fill_start")) < float(page.input_value("#fill_end"))
    # Dragging across the roll sets both inputs.
    page.locator("#roll").scroll_into_view_if_needed()
    box = page.locator("#roll").bounding_box()
    view = page.evaluate("window.musicrel.roll.view")
    at = lambda seconds: box["x"] + view["left"] + seconds / view["tEnd"] * view["pw"]  # noqa: E731
    y = box["y"] + box["height"] / 2
    page.mouse.move(at(6.2), y)
    page.mouse.down()
    page.mouse.move(at(4.5), y, steps=5)
    page.mouse.move(at(3.05), y, steps=5)
    page.mouse.up()
    start, end = float(page.input_value("#fill_start")), float(page.input_value("#fill_end"))
    assert abs(start - 3.05) < 0.1 and abs(end - 6.2) < 0.1, (start, end)
    assert page.evaluate("window.musicrel.roll.span.start") == start
    # The inputs win too: typed seconds are the span sent.
    page.fill("#fill_start", "3")
    page.fill("#fill_end", "6")
    page.fill("#seed", "7")
    page.fill("#num_samples", "1")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)

    kept, new = _span_notes(page)
    assert kept == 30, "the 30 notes outside 3-6 s come back"
    assert new, "the tiny model wrote no note in the span"
    assert all(3.0 - 1e-6 <= s < 6.0 and e <= 6.0 + 0.011 for s, e in new), new
    assert page.inner_text("#info-seed").strip() == "7"
    assert "new notes in the span" in page.get_attribute("#roll", "aria-label")
    assert page.inner_text("#legend-cont").strip() == "new notes"
    # The kept notes in the track's colour, the new ones outlined as well.
    (kept_pixels,) = page.evaluate(TRACK_PIXELS, [0])
    assert kept_pixels > 100 and page.evaluate(OUTLINE_IN_SPAN) > 10, kept_pixels
    # Heard in place at once: from 2 s before the span (1 s), not from the file's start.
    page.wait_for_function("window.musicrel.roll.playhead > 1.2", timeout=5000)
    assert page.evaluate("window.musicrel.synth.nodes.size") > 0
    page.click("#stop")

    with page.expect_download() as info:
        page.click("#download")
    out = pretty_midi.PrettyMIDI(info.value.path())
    given = pretty_midi.PrettyMIDI(str(path))
    outside = lambda pm: sorted(  # noqa: E731
        (n.pitch, round(n.start, 3)) for n in pm.instruments[0].notes if not 3.0 <= n.start < 6.0
    )
    assert outside(out) == outside(given)

    # Re-roll: the same span with a new seed, drawn by the server.
    assert page.is_visible("#reroll")
    page.click("#reroll")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    assert page.inner_text("#info-seed").strip() not in ("7", "—", "")
    assert _span_notes(page)[0] == 30


def test_fill_mode_takes_the_span_in_bars(page, tmp_path):
    """Bars typed: the seconds inputs follow the file's downbeats (4/4 at 100 bpm: 2.4 s a bar), the request
    sends the bars and the server's seconds come back; typing seconds again leaves the bars."""
    _fill_mode(page, tmp_path)
    bars = page.evaluate("window.musicrel.roll.bars")  # ticked on the roll
    assert bars[:4] == pytest.approx([0.0, 2.4, 4.8, 7.2], abs=1e-6) and len(bars) == 5, bars  # to 11.95 s
    page.fill("#fill_first_bar", "2")
    page.fill("#fill_last_bar", "3")
    assert float(page.input_value("#fill_start")) == 2.4 and float(page.input_value("#fill_end")) == 7.2
    assert page.evaluate("window.musicrel.roll.span.end") == 7.2
    page.fill("#seed", "7")
    page.fill("#num_samples", "1")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    answer = page.evaluate("window.musicrel.state.response")
    assert answer["settings"]["first_bar"] == 2 and answer["settings"]["last_bar"] == 3, answer["settings"]
    assert abs(answer["start"] - 2.4) < 1e-3 and abs(answer["end"] - 7.2) < 1e-3
    kept, new = _span_notes(page)
    assert kept == 24, "the notes outside bars 2-3 (2.4-7.2 s) come back"  # 40 notes, 16 in [2.4, 7.2)
    assert all(2.4 - 1e-3 <= s < 7.2 for s, _ in new), new
    page.fill("#fill_start", "3")
    assert page.input_value("#fill_first_bar") == "" and page.input_value("#fill_last_bar") == ""
    # Bars past the music: the server's error, in words, beside the last bar's input (the page sends them as
    # typed; the file has 5 bars, so bar 5 has no bar after it).
    page.fill("#fill_first_bar", "3")
    page.fill("#fill_last_bar", "5")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    assert "span_outside_music" in page.inner_text("#error")
    note = page.inner_text("#last_bar-error")
    assert "5 bars" in note, note
    assert page.evaluate(
        "document.getElementById('last_bar-error').closest('.field').contains(document.getElementById('fill_last_bar'))"
    )


def test_fill_mode_steers_the_span_with_the_controls_but_the_instrument(page, tmp_path):
    _fill_mode(page, tmp_path)
    page.click("#steer summary")
    assert page.is_visible("#key") and not page.is_visible("#program"), "new notes join the file's instrument"
    assert "instrument" not in page.inner_text("#steer summary"), "the summary lists only what Fill steers"
    auto = page.eval_on_selector("#key option[value=auto]", "o => o.textContent")
    assert auto == "auto (the key around the span)", auto
    page.select_option("#key", "C:major")
    page.select_option("#key_strength", "only")
    page.fill("#fill_start", "3")
    page.fill("#fill_end", "6")
    page.fill("#seed", "7")
    page.fill("#num_samples", "1")
    # An instrument chosen in Continue stays in its hidden field: Fill must not send it (the API refuses one).
    page.evaluate("document.getElementById('program').value = '40'")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    answer = page.evaluate("window.musicrel.state.response")
    assert answer["controls"] == {"key": "C:major", "key_strength": "only"}, answer["controls"]
    pitches = page.evaluate("window.musicrel.state.samples[0].contNotes.map(n => n.pitch)")
    # the line around the span walks all twelve pitch classes; "only" C major keeps the new notes in it
    assert pitches and all(p % 12 in {0, 2, 4, 5, 7, 9, 11} for p in pitches), pitches


def test_fill_mode_shows_a_span_with_nothing_after_it_beside_the_end_input(page, tmp_path):
    _fill_mode(page, tmp_path)
    page.fill("#fill_start", "10")
    page.fill("#fill_end", "14")  # the last note starts at 11.7 s
    page.fill("#seed", "7")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    assert "nothing_after" in page.inner_text("#error")
    assert page.is_visible("#end-error")
    assert page.get_attribute("#fill_end", "aria-invalid") == "true"
    assert page.is_enabled("#continue")


def test_fill_is_disabled_when_the_server_has_no_infill_model(browser, live_server):
    context = browser.new_context()
    page = context.new_page()

    def without_infill(route) -> None:
        response = route.fetch()
        body = response.json()
        body["infill"] = None
        route.fulfill(response=response, json=body)

    page.route("**/v1/model", without_infill)
    page.goto(f"{live_server}/")
    page.wait_for_function("document.getElementById('fill-mode-hint').textContent.includes('no infill')")
    assert page.is_disabled("#mode-fill")
    assert not page.is_visible("#fill_start")
    context.close()


# ---------------------------------------------------------------- tracks: colours, legend, Fill's picker
def _band_file(tmp_path: Path) -> Path:
    """Three tracks, 8 s: a piano line, a bass line and drums (kick and closed hi-hat)."""
    pm = pretty_midi.PrettyMIDI(initial_tempo=120)
    piano = pretty_midi.Instrument(program=0, name="Piano")
    piano.notes = [pretty_midi.Note(80, 64 + (k * 5) % 12, 0.5 * k, 0.5 * k + 0.4) for k in range(16)]
    bass = pretty_midi.Instrument(program=33, name="Bass")
    bass.notes = [pretty_midi.Note(80, 36 + (k * 7) % 12, 1.0 * k, 1.0 * k + 0.9) for k in range(8)]
    drums = pretty_midi.Instrument(program=0, is_drum=True, name="Drums")
    drums.notes = [pretty_midi.Note(100, 42 if k % 2 else 36, 0.25 * k, 0.25 * k + 0.1) for k in range(32)]
    pm.instruments += [piano, bass, drums]
    path = tmp_path / "band.mid"
    pm.write(str(path))
    return path


BAND_LEGEND = ["Piano · Acoustic Grand Piano", "Bass · Electric Bass (finger)", "drums"]


def test_a_band_file_is_drawn_in_its_tracks_colours_with_a_legend_and_drums_on_their_own_lane(page, tmp_path):
    page.wait_for_function("window.musicrel.state.programs !== null")  # the legend names the programs
    page.set_input_files("#file", str(_band_file(tmp_path)))
    page.wait_for_function("!document.getElementById('continue').disabled")
    legend = page.evaluate(LEGEND)
    assert [text for text, _, _ in legend] == BAND_LEGEND
    assert [drum for _, _, drum in legend] == [False, False, True]
    assert len({colour for _, colour, _ in legend}) == 3, legend
    piano, bass, drums = page.evaluate(TRACK_PIXELS, [0, 1, 2])
    assert piano > 100 and bass > 100 and drums > 30, (piano, bass, drums)
    # The drums are marks on a lane of their own under the pitches, not notes at a pitch.
    view = page.evaluate("window.musicrel.roll.view")
    assert view["lane"] and view["lane"]["height"] >= 18
    assert view["top"] + (view["hi"] - view["lo"] + 1) * view["rowH"] <= view["lane"]["top"]
    # Played as noise bursts, never as pitched voices.
    kinds = page.evaluate(
        """() => { const s = window.musicrel.synth;
          s.play(window.musicrel.state.motif.notes.filter((n) => n.drum), 0);
          const kinds = [...s.nodes].map((n) => n.constructor.name); s.stop(); return kinds; }"""
    )
    assert kinds and set(kinds) == {"AudioBufferSourceNode"}, kinds


ROLL_BACKGROUND = "() => getComputedStyle(document.documentElement).getPropertyValue('--roll-bg').trim()"


def test_the_legend_colours_hold_in_the_dark_theme(browser, live_server, tmp_path):
    """Every track colour stands out from the roll's background in both themes (contrast at least 2:1)."""
    contrast = """() => {
      const css = getComputedStyle(document.documentElement);
      const lum = (v) => css.getPropertyValue(v).trim().match(/\\w\\w/g).map((h) => parseInt(h, 16) / 255)
        .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4))
        .reduce((a, c, i) => a + c * [0.2126, 0.7152, 0.0722][i], 0);
      const bg = lum('--roll-bg');
      return [0, 1, 2, 3, 4, 5, 6, 7].map((k) => {
        const l = lum(`--track-${k}`);
        return (Math.max(l, bg) + 0.05) / (Math.min(l, bg) + 0.05);
      });
    }"""
    context = browser.new_context(color_scheme="light")
    page = context.new_page()
    try:
        page.goto(f"{live_server}/")
        backgrounds = set()
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)  # the style sheet follows at once: one load for both
            assert page.evaluate("s => matchMedia(`(prefers-color-scheme: ${s})`).matches", scheme)
            backgrounds.add(page.evaluate(ROLL_BACKGROUND))
            ratios = page.evaluate(contrast)
            assert min(ratios) >= 2.0, (scheme, ratios)
        assert len(backgrounds) == 2, backgrounds  # the dark theme's own roll was the one measured
    finally:
        context.close()


def _posted_fields(body: bytes) -> dict[str, str]:
    """The text fields of a multipart/form-data body."""
    import re

    found = re.findall(rb'name="([^"]+)"\r\n\r\n(.*?)\r\n--', body, re.S)
    return {name.decode(): value.decode() for name, value in found if name != b"file"}


def test_fill_sends_the_tracks_picked_and_keeps_each_tracks_colour(page, tmp_path):
    page.wait_for_function("!document.getElementById('mode-fill').disabled")
    page.check("#mode-fill")
    page.set_input_files("#file", str(_band_file(tmp_path)))
    page.wait_for_function("!document.getElementById('continue').disabled")
    boxes = "#fill-tracks-list input[type=checkbox]"
    assert page.eval_on_selector_all(boxes, "bs => bs.map(b => [b.value, b.checked])") == [
        ["0", True],
        ["1", True],
        ["2", True],
    ]
    labels = page.eval_on_selector_all("#fill-tracks-list label", "ls => ls.map(l => l.textContent)")
    assert labels == [
        "0: Piano · Acoustic Grand Piano (16 notes)",
        "1: Bass · Electric Bass (finger) (8 notes)",
        "2: drums (32 notes)",
    ]
    before = page.evaluate(LEGEND)
    sent: list[dict[str, str]] = []

    def capture(route) -> None:
        sent.append(_posted_fields(route.request.post_data_buffer))
        route.continue_()

    page.route("**/v1/infills", capture)
    page.fill("#fill_start", "2")
    page.fill("#fill_end", "5")
    page.fill("#seed", "7")
    page.fill("#num_samples", "1")
    # Every track checked: the field is left out (the API's default).
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    assert sent[-1]["start"] == "2" and sent[-1]["end"] == "5" and "tracks" not in sent[-1], sent[-1]
    after = {text: colour for text, colour, _ in page.evaluate(LEGEND)}
    for text, colour, _ in before:  # a track keeps its colour from the upload to the result
        assert after.get(text, colour) == colour, (text, after)
    assert set(after) & {text for text, _, _ in before}, after

    # Only the bass: tracks=1 (the server that knows the field rewrites the bass alone).
    page.uncheck("#fill-track-0")
    page.uncheck("#fill-track-2")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done], #app[data-state=error]", timeout=GENERATION_TIMEOUT_MS)
    assert sent[-1]["tracks"] == "1", sent[-1]
    assert page.is_enabled("#continue")

    # None: refused before sending, beside the picker.
    page.uncheck("#fill-track-1")
    page.click("#continue")
    assert "at least one track" in page.inner_text("#error")
    assert len(sent) == 2
    assert page.get_attribute("#fill-tracks", "aria-invalid") == "true"
    page.check("#fill-track-1")
    assert page.get_attribute("#fill-tracks", "aria-invalid") is None


def test_a_streamed_continuation_colours_each_note_by_the_track_the_stream_names(page, tmp_path):
    """A model with instruments streams each note's track and instrument (128: drums): drawn live in that
    track's colour, the drums as drums, and the result's file in the same colours as the upload."""
    import base64
    import json

    band = _band_file(tmp_path)
    page.wait_for_function("window.musicrel.state.programs !== null")
    page.set_input_files("#file", str(band))
    page.wait_for_function("!document.getElementById('continue').disabled")
    uploaded = page.evaluate(LEGEND)
    tracks = [
        {"index": 0, "name": "Piano", "program": 0, "drum": False, "source": 0},
        {"index": 1, "name": "Bass", "program": 33, "drum": False, "source": 1},
        {"index": 2, "name": "Drums", "program": 0, "drum": True, "source": 2},
        {"index": 3, "name": "Strings", "program": 48, "drum": False, "source": None},
    ]
    primer = {
        "start_time": 0,
        "end_time": 8,
        "tokens": 10,
        "program": 0,
        "instrument": "Acoustic Grand Piano",
    }
    # The sample's file: the motif's tracks, then strings the model brought in (a track the upload lacks).
    answer = pretty_midi.PrettyMIDI(str(band))
    strings = pretty_midi.Instrument(program=48, name="Strings")
    strings.notes = [pretty_midi.Note(80, 60, 8.2, 9.0)]
    answer.instruments.append(strings)
    answer.write(str(tmp_path / "answer.mid"))
    sample = {"index": 0, "midi_base64": base64.b64encode((tmp_path / "answer.mid").read_bytes()).decode()}
    events = [
        {"type": "start", "seed": 3, "settings": {}, "primer": primer, "tracks": tracks, "samples": 1},
        {"type": "note_on", "sample": 0, "id": 1, "pitch": 40, "velocity": 90, "time": 0.0, "track": 1,
         "instrument": 33},
        {"type": "note_on", "sample": 0, "id": 2, "pitch": 36, "velocity": 90, "time": 0.1, "track": 2,
         "instrument": 128},
        {"type": "note_off", "sample": 0, "id": 1, "time": 0.5},
        {"type": "note_on", "sample": 0, "id": 3, "pitch": 60, "velocity": 80, "time": 0.2, "track": 3,
         "instrument": 48},
        {"type": "result", "seed": 3, "settings": {}, "primer": primer, "tracks": tracks, "new_tokens": 4,
         "samples": [sample], "timings": {}, "model": "instruments"},
    ]  # fmt: skip
    body = "".join(json.dumps(e) + "\n" for e in events)
    page.route(
        "**/v1/continuations/stream",
        lambda route: route.fulfill(status=200, content_type="application/x-ndjson", body=body),
    )
    page.fill("#seconds", "2")
    page.click("#continue")
    page.wait_for_selector("#app[data-state=done]", timeout=GENERATION_TIMEOUT_MS)
    live = page.evaluate("window.musicrel.state.stream.liveNotes.map((n) => [n.slot, n.drum, n.program])")
    assert live == [[1, False, 33], [2, True, 0], [3, False, 48]], live
    # a server's instruments model wrote it (the answer's `model`): the closing line says so
    assert "Written by the instruments model" in page.inner_text("#status")
    # The result's tracks in the upload's colours, and the strings in the colour they had live.
    legend = page.evaluate(LEGEND)
    assert legend[:3] == uploaded and [text for text, _, _ in legend[3:]] == ["Strings · String Ensemble 1"]
    assert (
        page.evaluate("window.musicrel.state.samples[0].contNotes.filter((n) => n.program === 48)[0].slot")
        == 3
    )
