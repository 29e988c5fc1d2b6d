"""Controls: parsing and validation (stable codes), JSON round trip, the grammar's rules, no control = the
uncontrolled path exactly, metadata, and the evidence (every target met on a tiny untrained model, whose
uncontrolled figures miss them)."""

from __future__ import annotations

import json
import math

import numpy as np
import pretty_midi
import pytest
import torch

from musicrel.evaluation.control_evidence import (
    chord_at,
    chord_tone_share,
    evaluate_controls,
    in_scale_share,
    progression,
)
from musicrel.evaluation.metrics import polyphony
from musicrel.generation.controls import (
    DENSITY_CHORD,
    DENSITY_MAX_BIAS,
    PREFER_BIAS,
    ControlError,
    Controls,
    chords_outside_key,
    gm_program_names,
    parse_chord,
    parse_chords,
    parse_key,
)
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.grammar import Grammar
from musicrel.generation.primer import prepare_primer, render_result
from musicrel.generation.sampling import SamplingParams
from musicrel.midi.codec import EventCodec
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer

CODEC = EventCodec()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared machine
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> MusicTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=CODEC.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128
    )
    return MusicTransformer(cfg).eval()


def motif(shift: int = 0, tempo: float = 100.0, step: float = 0.25):
    pm = pretty_midi.PrettyMIDI(initial_tempo=tempo)
    inst = pretty_midi.Instrument(program=0)
    scale = [0, 2, 4, 5, 7, 9, 11, 12]  # a major scale up and down: a key the detector finds
    for k in range(24):
        pitch = 60 + shift + scale[k % 8 if (k // 8) % 2 == 0 else 7 - k % 8]
        inst.notes.append(pretty_midi.Note(80, pitch, k * step, k * step + 0.3))
    pm.instruments.append(inst)
    return prepare_primer(CODEC, pm, max_tokens=96)


def notes_of(pm) -> list:
    return [n for inst in pm.instruments for n in inst.notes]


# ----------------------------------------------------------------------------------------------------------
# Parsing and validation


@pytest.mark.parametrize(
    "symbol, pitch_classes",
    [
        ("C", {0, 4, 7}),
        ("Am", {9, 0, 4}),
        ("F#m7", {6, 9, 1, 4}),
        ("Bb", {10, 2, 5}),
        ("G7", {7, 11, 2, 5}),
        ("Cmaj7", {0, 4, 7, 11}),
        ("Bdim", {11, 2, 5}),
        ("Caug", {0, 4, 8}),
        ("Dsus2", {2, 4, 9}),
        ("Dsus4", {2, 7, 9}),
        ("C/E", {0, 4, 7}),
        ("C/Bb", {0, 4, 7, 10}),
        ("Ebm", {3, 6, 10}),
    ],
)
def test_chord_symbols(symbol, pitch_classes):
    assert parse_chord(symbol) == pitch_classes


@pytest.mark.parametrize("bad", ["H", "Cx", "C#b", "Cmaj9", "m", "c", "C/X", ""])
def test_unknown_chord_symbol_has_its_code(bad):
    with pytest.raises(ControlError) as e:
        Controls(chords=f"C:2 {bad}:2" if bad else " ")
    assert e.value.code == "unknown_chord"


@pytest.mark.parametrize("bad", ["C:0", "C:-1", "C:x", "C:2s", "C:61"])
def test_bad_chord_duration_has_its_code(bad):
    with pytest.raises(ControlError) as e:
        Controls(chords=bad)
    assert e.value.code == "invalid_controls"


def test_chord_durations_in_seconds_beats_and_default_bar():
    chords = parse_chords("C:2 G:4b, Am | F")
    assert [(c.duration, c.beats) for c in chords] == [(2.0, False), (4.0, True), (4.0, True), (4.0, True)]
    primer = motif(tempo=120.0)  # a beat is 0.5 s
    applied = Controls(chords="C:2 G:4b Am").resolve(primer, CODEC.config.step_ms).applied["chords"]
    assert [c["seconds"] for c in applied] == [2.0, 2.0, 2.0]


def test_chords_outside_the_key_are_warned_about_not_refused():
    primer = motif(tempo=120.0)
    inside = Controls(key="C:major", chords="C:1 Am:1 G7:1").resolve(primer, CODEC.config.step_ms)
    assert inside.warnings == []
    row = Controls(key="C:major", chords="C:1 E:1 C:1 Bb/Ab:1").resolve(primer, CODEC.config.step_ms)
    assert row.warnings == [  # each symbol once, naming the tones outside
        "chord E has Ab outside the key C:major",
        "chord Bb/Ab has Ab, Bb outside the key C:major",
    ]
    assert len(row.chord_ends) == 4  # still applied as asked
    assert chords_outside_key(parse_chords("E"), parse_key("E:major")) == []


@pytest.mark.parametrize(
    "fields, code",
    [
        ({"low_note": 70, "high_note": 60}, "empty_range"),
        ({"key": "C:major", "key_strength": "only", "low_note": 61, "high_note": 61}, "empty_range"),
        ({"key": "H:major"}, "unknown_key"),
        ({"key": "C:ionian-ish"}, "unknown_key"),
        ({"key_strength": "always"}, "invalid_controls"),
        ({"chord_strength": 25.0}, "invalid_controls"),
        ({"chord_strength": -1}, "invalid_controls"),
        ({"density": 0}, "invalid_controls"),
        ({"density": math.nan}, "invalid_controls"),
        ({"low_note": 128}, "invalid_controls"),
        ({"max_polyphony": 0}, "invalid_controls"),
        ({"program": 128}, "invalid_controls"),
        ({"program": "Kazoo"}, "invalid_controls"),
    ],
)
def test_invalid_controls_have_stable_codes(fields, code):
    with pytest.raises(ControlError) as e:
        Controls(**fields)
    assert e.value.code == code
    assert str(e.value)  # a message a person can read


def test_a_prefer_key_outside_the_range_is_fine_but_only_is_empty():
    Controls(key="C:major", low_note=61, high_note=61)  # a bias: the pitch is merely dispreferred
    auto = Controls(key="auto", key_strength="only", low_note=61, high_note=61)  # checked against the motif
    with pytest.raises(ControlError) as e:
        auto.resolve(motif(), CODEC.config.step_ms)
    assert e.value.code == "empty_range"


def test_a_density_too_small_to_divide_starts_at_the_bias_floor_not_a_math_error():
    """The API fuzz sent density=5e-324: its ratio to the motif's rate underflowed to 0, and log(0) was a
    500."""
    primer = motif()
    tiny = Controls(density=5e-324).resolve(primer, CODEC.config.step_ms)
    assert tiny.density_start == -DENSITY_MAX_BIAS
    assert Controls(density=1e-6).resolve(primer, CODEC.config.step_ms).density_start == -DENSITY_MAX_BIAS


def test_normalised_and_json_round_trip():
    c = Controls(program="Acoustic Guitar (nylon)", key="f#:minor", key_strength="ONLY", chords="C:2  G7:4b",
                 chord_strength=2, density=3, low_note=40, high_note=80, max_polyphony=3)  # fmt: skip
    assert c.program == 24 and c.key == "F#:minor" and c.key_strength == "only" and c.chord_strength == 2.0
    assert Controls.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(ControlError) as e:
        Controls.from_dict({"keys": "C"})
    assert e.value.code == "invalid_controls"
    assert parse_key("Bb") == (10, "major")
    assert len(gm_program_names()) == 128 and gm_program_names()[0] == "Acoustic Grand Piano"


def test_sampling_params_takes_controls_and_an_empty_one_is_none():
    assert SamplingParams(controls=Controls()).controls is None
    assert SamplingParams(controls=Controls(key_strength="only")).controls is None  # a strength alone
    assert SamplingParams(controls={"density": 3}).controls == Controls(density=3)
    with pytest.raises(ControlError):
        SamplingParams(controls={"density": -3})


# ----------------------------------------------------------------------------------------------------------
# The rules in the grammar


def grammar_with(controls: list, elapsed: int = 0) -> Grammar:
    primer = motif()
    rows = [None if c is None else c.resolve(primer, CODEC.config.step_ms) for c in controls]
    g = Grammar(CODEC, [primer.tokens] * len(controls), [10_000] * len(controls), controls=rows)
    g.elapsed += elapsed
    return g


def test_key_only_masks_and_prefer_moves_mass_within_the_note_ons():
    torch.manual_seed(1)
    logits = torch.randn(3, CODEC.vocab_size)
    g = grammar_with([Controls(key="C:major", key_strength="only"), Controls(key="C:major"), None])
    out = g.constrain(logits.clone())
    on = slice(CODEC.note_on_offset, CODEC.note_on_offset + 128)
    outside = torch.tensor([p % 12 not in (0, 2, 4, 5, 7, 9, 11) for p in range(128)])
    assert torch.isinf(out[0, on][outside]).all() and torch.isfinite(out[0, on][~outside]).all()
    inside_p, outside_p = int(np.flatnonzero(~outside.numpy())[0]), int(np.flatnonzero(outside.numpy())[0])
    gap = (out[1, on][inside_p] - out[1, on][outside_p]) - (
        g_in := logits[1, on][inside_p] - logits[1, on][outside_p]
    )
    assert g_in.isfinite() and gap.item() == pytest.approx(PREFER_BIAS, abs=1e-4)
    base = Grammar(CODEC, [motif().tokens] * 3, [10_000] * 3).constrain(logits.clone())  # no controls at all
    # the pitch controls choose which notes, not how many: the note-ons keep their mass
    for r in (0, 1):
        assert out[r, on].logsumexp(0).item() == pytest.approx(base[r, on].logsumexp(0).item(), abs=1e-4)
    assert torch.equal(out[2], base[2])  # a row without controls is untouched in a controlled batch


def test_the_chord_follows_the_rows_time_and_repeats():
    c = Controls(chords="C:1 F#:1", chord_strength="only")
    logits = torch.zeros(3, CODEC.vocab_size)
    g = grammar_with([c, c, c])
    g.elapsed = torch.tensor([0, 150, 250])  # steps: in C, in F#, in C again (period 200)
    out = g.constrain(logits)
    on = CODEC.note_on_offset
    allowed = [{p % 12 for p in range(128) if torch.isfinite(out[r, on + p])} for r in range(3)]
    assert allowed == [{0, 4, 7}, {6, 10, 1}, {0, 4, 7}]


def test_polyphony_cap_masks_new_notes_only_when_full():
    g = grammar_with([Controls(max_polyphony=2), Controls(max_polyphony=3)], elapsed=10)
    g.open[:] = False
    g.open[:, [60, 64]] = True
    g.onset[:, [60, 64]] = 9  # struck a step ago: not overdue
    out = g.constrain(torch.zeros(2, CODEC.vocab_size))
    on = slice(CODEC.note_on_offset, CODEC.note_on_offset + 128)
    assert torch.isfinite(out[0, on]).sum() == 2  # only re-strikes of the two sounding notes
    assert torch.isfinite(out[1, on]).all()


def test_density_tilts_the_time_shifts_as_well_as_the_note_ons():
    """Notes too fast: note-ons lose and longer gaps win; too slow: the reverse. A note-on bias alone left a
    dense model at 9 notes/s for a target of 3: after a time shift a note-on is all it considers."""
    g = grammar_with([Controls(density=3.0), Controls(density=3.0), None])
    g.density.bias = torch.tensor([-4.0, 4.0, 0.0])
    g.open[:] = False  # nothing to close: no note-off is legal, as after a shift in a melody
    g.onset[:] = -(2**62)
    out = g.constrain(torch.zeros(3, CODEC.vocab_size))
    shifts = slice(CODEC.time_shift_offset, CODEC.velocity_offset)
    on = slice(CODEC.note_on_offset, CODEC.note_on_offset + 128)
    p = out.softmax(dim=1)
    seconds = (
        torch.arange(1, CODEC.velocity_offset - CODEC.time_shift_offset + 1) * CODEC.config.step_ms / 1000
    )
    mean_gap = (p[:, shifts] * seconds).sum(dim=1) / p[:, shifts].sum(dim=1)
    assert mean_gap[0] > mean_gap[2] > mean_gap[1]
    assert p[0, on].sum() < p[2, on].sum() < p[1, on].sum()
    # while a chord is being struck, more notes are not pushed into it past DENSITY_CHORD
    g.onset[1, 60 : 60 + DENSITY_CHORD] = g.elapsed[1]
    g.open[1, 60 : 60 + DENSITY_CHORD] = True
    full = g.constrain(torch.zeros(3, CODEC.vocab_size)).softmax(dim=1)
    assert full[1, on].sum() < p[1, on].sum()


# ----------------------------------------------------------------------------------------------------------
# Generation


def test_no_control_is_the_uncontrolled_path_exactly(model):
    primer = motif()
    plain = [(primer, SamplingParams(seconds=4, seed=5, num_samples=2))]
    empty = [(primer, SamplingParams(seconds=4, seed=5, num_samples=2, controls=Controls()))]
    a, b = generate_batch(model, CODEC, plain)[0], generate_batch(model, CODEC, empty)[0]
    assert all(np.array_equal(x, y) for x, y in zip(a.tokens, b.tokens, strict=True)) and b.controls is None
    # sharing the batch with a controlled job changes nothing for an uncontrolled one
    steered = (motif(shift=2), SamplingParams(seconds=4, seed=1, controls=Controls(key="auto", density=6)))
    c = generate_batch(model, CODEC, [steered, *plain])[1]
    assert all(np.array_equal(x, y) for x, y in zip(a.tokens, c.tokens, strict=True))
    # while the controls do change what the controlled job draws
    alone = generate_batch(model, CODEC, [(steered[0], SamplingParams(seconds=4, seed=1))])[0]
    assert not np.array_equal(alone.tokens[0], generate_batch(model, CODEC, [steered])[0].tokens[0])


def test_controls_are_recorded_and_the_program_applied(model):
    params = SamplingParams(seconds=3, seed=0, controls=Controls(program=40, key="auto", chords="Am:1 F:1"))
    primer = motif(shift=9)  # A major scale
    result = generate_batch(model, CODEC, [(primer, params)])[0]
    assert result.controls["key"] == "A:major" and result.controls["key_detected"] is True
    assert result.controls["instrument"] == "Violin" and result.controls["program"] == 40
    assert result.warnings == [
        "chord Am has C outside the key A:major",
        "chord F has C, F outside the key A:major",
    ]
    pm = render_result(CODEC, primer, result)[0]  # the program and the controls' record: as a user gets them
    assert pm.instruments[0].program == 40
    texts = [t.text for t in pm.text_events]
    assert "musicrel seed=0 sample=0" in texts
    meta = json.loads(next(t for t in texts if t.startswith("musicrel controls=")).split("=", 1)[1])
    assert meta == result.controls


def test_chord_measure_matches_the_schedule():
    chords = [{"chord": "C", "seconds": 1.0}, {"chord": "G", "seconds": 0.5}]
    assert [chord_at(chords, t) for t in (0.0, 0.99, 1.0, 1.49, 1.5, 2.6)] == [0, 0, 1, 1, 0, 1]
    notes = [pretty_midi.Note(80, 60, 0.2, 0.4), pretty_midi.Note(80, 62, 1.1, 1.2)]  # C in C; D in G
    assert chord_tone_share(notes, chords) == 1.0
    assert in_scale_share(notes, (6, "major")) == 0.0  # neither C nor D is in F# major


def test_progression_is_in_the_key():
    assert progression((0, "major")) == "C:2 G:2 Am:2 F:2"
    assert progression((9, "minor")) == "Am:2 F:2 C:2 G:2"


def test_every_target_is_met_on_a_tiny_model_whose_own_figures_miss_them(model):
    """The issue's evidence, on an untrained model: masks hold exactly, biases and the density loop reach
    their targets, and without controls the same model misses each (so each check can fail)."""
    primers = [motif(), motif(shift=5, step=0.2), motif(shift=9, step=0.4)]
    checks = {c.name: c for c in evaluate_controls(model, CODEC, primers, seconds=12.0, samples=2, seed=0)}
    for c in checks.values():
        assert c.ok, c
    assert checks["key only: in scale"].spread[0] == 1.0
    assert checks["key prefer: in scale"].baseline < 0.9
    assert checks["chords: chord-tone onsets"].baseline < 0.8
    # this model plays ~3 notes/s by itself: 8 is the density target it misses alone (6, below, is another)
    assert abs(checks["density 8: notes/s"].baseline / 8 - 1) > 0.2
    assert checks["range 48-72: inside"].baseline < 1.0
    assert checks["range: most notes at once"].baseline > 3


def test_density_is_held_through_the_continuation(model):
    """A feedback loop, not a fixed bias: each half of a long continuation is near the target."""
    params = SamplingParams(seconds=20, seed=3, num_samples=2, controls=Controls(density=6))
    primer = motif(step=0.5)
    for pm in render_result(CODEC, primer, generate_batch(model, CODEC, [(primer, params)])[0]):
        starts = np.array([n.start for n in notes_of(pm)])
        for half in (starts < 10, starts >= 10):
            assert half.sum() / 10 == pytest.approx(6, rel=0.3)
        assert polyphony(notes_of(pm))[1] > 0


def test_key_auto_reads_the_motifs_pitched_notes_not_its_drums():
    """A drum note's number names a sound (42: a closed hi-hat), not a pitch: key detection skips them."""
    from musicrel.generation.keys import find_key, key_label
    from musicrel.generation.primer import Primer
    from musicrel.midi.instruments import DRUMS

    a_minor = [57, 60, 64, 57, 60, 64, 69]
    pitched = [pretty_midi.Note(80, p, i / 2, i / 2 + 0.4) for i, p in enumerate(a_minor)]
    drums = [pretty_midi.Note(80, p, i / 4, i / 4 + 0.1) for i, p in enumerate([37, 39, 42, 44, 46, 49] * 4)]
    primer = Primer(
        tokens=np.zeros(0, np.int64), start_time=0.0, end_time=4.0, tempo=120.0, program=0, notes=[],
        motif_notes=pitched + drums, motif_instruments=[0] * len(pitched) + [DRUMS] * len(drums),
    )  # fmt: skip
    applied = Controls(key="auto").resolve(primer, 10).applied
    assert applied["key"] == key_label(find_key(pitched)) != key_label(find_key(pitched + drums))


def test_density_counts_a_bands_drum_hits_in_its_target_and_in_what_it_measures():
    """A band motif (drums, bass, guitar): the rate the loop starts from (the motif's notes a second) and
    the rate it measures while the continuation is written count the same notes, drum hits among them
    (docs/CONTROLS.md, density with drums)."""
    from tests.musicrel.generation.test_continuation_tracks import CODEC as BAND
    from tests.musicrel.generation.test_continuation_tracks import as_bytes, band, tokens

    upload = band()
    primer = prepare_primer(BAND, as_bytes(upload))
    every = [n for inst in upload.instruments for n in inst.notes]
    assert len(primer.motif_notes) == len(every) == 40  # 24 of them drum hits
    seconds = max(n.end for n in every) - min(n.start for n in every)
    resolved = Controls(density=5.0).resolve(primer, BAND.config.step_ms)
    assert resolved.density_start == pytest.approx(math.log(5.0 / (40 / seconds)), abs=1e-6)
    grammar = Grammar(BAND, [primer.tokens], [10_000], controls=[resolved])
    counted = []
    for token in tokens(("inst", 128), ("on", 36), ("inst", 33), ("on", 40), ("inst", 128), ("on", 42)):
        before = float(grammar.density.recent[0])
        grammar.advance(torch.tensor([int(token)]))
        counted.append(float(grammar.density.recent[0]) - before)
    assert counted == pytest.approx([0, 1, 0, 1, 0, 1])  # no time passes: each note-on adds one, a hit too
