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


# Pixels of the roll in each layer's hue: the melody's blue (--motif) and the accompaniment's orange (--cont),
# at any velocity's transparency over the light background; the playhead's red (green below blue) is neither.
COLOUR_COUNTS = """() => {
  const c = document.getElementById('roll');
  const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let blue = 0, orange = 0;
  for (let i = 0; i < px.length; i += 4) {
    const r = px[i], g = px[i + 1], b = px[i + 2];
    if (b - r > 40 && b - g > 20) blue++;
    if (r - b > 60 && g - b > 20) orange++;
  }
  return [blue, orange];
}"""


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
    blue, orange = page.evaluate(COLOUR_COUNTS)
    assert blue > 100 and orange == 0, (blue, orange)  # the melody alone before Accompany
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
    blue, orange = page.evaluate(COLOUR_COUNTS)
    assert blue > 100 and orange > 50, f"both layers drawn in their colours: blue {blue}, orange {orange}"

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
    blue, orange = page.evaluate(COLOUR_COUNTS)
    assert blue > 100 and orange > 10, (blue, orange)
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
