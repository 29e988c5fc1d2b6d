"""The grammar with a codec that has instruments (INSTRUMENT tokens, note state per instrument), and without
them: the same tokens as before instruments existed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from musicrel.errors import GenerationError
from musicrel.generation.controls import ControlError, Controls
from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.grammar import (
    _FOREVER,
    KEEP_MAX_NATS,
    KEEP_SLOPE,
    MAX_REPEATS,
    Grammar,
    instrument_onsets,
    strike_gaps,
)
from musicrel.generation.primer import Primer, prepare_primer
from musicrel.generation.sampling import SamplingParams
from musicrel.midi.codec import CodecConfig, EventCodec
from musicrel.midi.instruments import DRUMS, RANGES
from musicrel.model.config import ModelConfig
from musicrel.model.transformer import MusicTransformer
from tests.musicrel.conftest import CODEC, make_motif, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

BAND = EventCodec(CodecConfig(instruments=True))
ON, OFF, SHIFT, VEL = BAND.note_on_offset, BAND.note_off_offset, BAND.time_shift_offset, BAND.velocity_offset
VIOLIN, CELLO, KIT = BAND.instrument_offset + 40, BAND.instrument_offset + 42, BAND.drums_id


def _any(rows: int = 1) -> list:
    """Controls that let every instrument play (the default is the motif's): for the rules other than that."""
    return [Controls(instruments="any").resolve(None, BAND.config.step_ms)] * rows


def _peaked(*tokens: int, codec=BAND) -> torch.Tensor:
    logits = torch.zeros(len(tokens), codec.vocab_size)
    for r, t in enumerate(tokens):
        logits[r, t] = 30.0
    return logits


def _allowed(grammar: Grammar) -> torch.Tensor:
    return grammar.constrain(torch.zeros(1, grammar.codec.vocab_size)).isfinite()[0]


def test_a_codec_without_instruments_never_reaches_the_instrument_rules(monkeypatch):
    """Nothing changes for a codec without instruments: with the instrument rules made to fail, it draws the
    same tokens for the same seeds (with and without controls) as it does with them, so it never runs them.
    (When instruments came in, these very jobs drew the same 228 tokens as the grammar before them.)"""
    import musicrel.generation.grammar as grammar_module

    primer = prepare_primer(CODEC, make_motif(), 4.0)
    controls = dict(density=4.0, key="C:major", max_polyphony=3)
    jobs = [
        (primer, SamplingParams(seconds=6.0, seed=3, num_samples=2, temperature=1.2)),
        (primer, SamplingParams(seconds=6.0, seed=5, controls=controls)),
    ]

    def draw():
        res = generate_batch(tiny_model(), CODEC, jobs)
        return np.concatenate([np.asarray(t, dtype=np.int64) for r in res for t in r.tokens])

    before = draw()

    def fail(*args, **kwargs):
        raise AssertionError("an instrument rule ran for a codec without instruments")

    monkeypatch.setattr(grammar_module, "_Instruments", fail)
    monkeypatch.setattr(grammar_module, "instrument_onsets", fail)
    monkeypatch.setattr(grammar_module, "current_instrument", fail)
    assert np.array_equal(draw(), before) and len(before) > 100
    grammar = Grammar(CODEC, [primer.tokens], [100])
    assert grammar.inst is None and not grammar.allowed[CODEC.pad_id :].any()


def test_instrument_tokens_allowed_only_with_instruments():
    grammar = Grammar(BAND, [np.array([VIOLIN, ON + 60])], [1000], controls=_any())
    allowed = _allowed(grammar)
    assert allowed[BAND.instrument_offset : BAND.instrument_offset + 129].sum() == 128  # all but the current
    assert not allowed[VIOLIN] and allowed[CELLO] and allowed[KIT]
    assert not allowed[BAND.pad_id : BAND.instrument_offset].any()  # specials never
    infill = EventCodec(CodecConfig(instruments=True, infill=True))
    allowed = _allowed(Grammar(infill, [np.array([ON + 60])], [1000], controls=_any()))
    assert not allowed[infill.pad_id : infill.instrument_offset].any()  # markers never
    assert allowed[infill.instrument_offset + 1 :].all() and not allowed[infill.instrument_offset]


def test_note_state_is_per_instrument():
    # the violin and the cello both sound 60; the cello closes its own, the violin's sounds on
    prompt = np.array([VIOLIN, ON + 60, SHIFT + 9, CELLO, ON + 60, SHIFT + 9, OFF + 60])
    current, onsets = instrument_onsets(BAND, prompt)
    assert current == 42 and onsets[40, 60] == -20 and onsets[42, 60] < -(2**60)
    grammar = Grammar(BAND, [prompt], [1000])
    assert not grammar.open[0, 60]  # the cello's 60 is closed: its note-off is not allowed
    assert not _allowed(grammar)[OFF + 60]
    grammar.advance(torch.tensor([VIOLIN]))
    assert grammar.open[0, 60] and grammar.onset[0, 60] == -20  # the violin's, with its clock
    assert _allowed(grammar)[OFF + 60]
    grammar.advance(torch.tensor([OFF + 60]))
    grammar.advance(torch.tensor([CELLO]))
    assert not grammar.open.any()


def test_after_an_instrument_a_note_event_comes():
    grammar = Grammar(BAND, [np.array([VIOLIN, ON + 60, SHIFT + 9])], [1000], controls=_any())
    grammar.advance(torch.tensor([CELLO]))
    allowed = _allowed(grammar)
    low, high = RANGES[42]  # the cello strikes within its range
    assert allowed[ON + low : ON + high + 1].all() and not allowed[ON : ON + low].any()
    assert allowed[VEL : VEL + 32].all()
    assert not allowed[SHIFT : SHIFT + 100].any() and not allowed[BAND.instrument_offset :].any()
    assert not allowed[OFF : OFF + 128].any()  # the cello has nothing sounding
    grammar.advance(torch.tensor([VEL + 20]))
    assert _allowed(grammar)[SHIFT : SHIFT + 100].all()


@pytest.mark.parametrize(("motif_kit", "low"), [((36, 38, 42), 27), ((36, 22, 42), 22)])
def test_drums_strike_the_general_midi_percussion_keys(motif_kit, low):
    # a kit's keys are 27-87; a motif whose drums strike below (the Groove kit's 22) widens them to its own
    prompt = [VIOLIN, ON + 60, SHIFT + 9, KIT] + [t for key in motif_kit for t in (ON + key, SHIFT + 4)]
    grammar = Grammar(BAND, [np.array(prompt + [VIOLIN, ON + 62])], [1000])
    grammar.advance(torch.tensor([KIT]))
    strikes = _allowed(grammar)[ON : ON + 128].nonzero().flatten().tolist()
    assert strikes == list(range(low, 88))


def test_another_instruments_overdue_note_forces_a_switch_then_its_note_off():
    # the violin's 60 was struck 50 steps before the cut; max_hold 60 steps: due 10 steps after the cut
    prompt = np.array([VIOLIN, ON + 60, SHIFT + 49, CELLO, ON + 48])
    grammar = Grammar(BAND, [prompt], [1000], max_hold_steps=[60])
    grammar.advance(torch.tensor([SHIFT + 29]))  # 30 steps asked, cut to land on the violin's deadline
    assert int(grammar.elapsed[0]) == 10
    allowed = _allowed(grammar)
    assert allowed.nonzero().flatten().tolist() == [VIOLIN]
    assert grammar.advance(grammar.constrain(_peaked(ON + 70)).argmax(dim=1)).item() == VIOLIN
    logits = grammar.constrain(_peaked(ON + 70))
    assert logits.argmax().item() == OFF + 60 and _allowed(grammar).sum() == 1


def test_drums_repeat_without_the_drone_rule():
    kick = [ON + 36, SHIFT + 9, OFF + 36] * MAX_REPEATS
    drums = Grammar(BAND, [np.array([KIT, *kick])], [1000])
    piano = Grammar(BAND, [np.array(kick)], [1000])
    assert drums.constrain(_peaked(ON + 36)).argmax().item() == ON + 36
    assert piano.constrain(_peaked(ON + 36)).argmax().item() != ON + 36


def test_rows_leave_and_join_with_their_instruments():
    a = Grammar(BAND, [np.array([VIOLIN, ON + 60])], [1000])
    b = Grammar(BAND, [np.array([KIT, ON + 36]), np.array([CELLO, ON + 48])], [1000, 1000])
    a.extend(b)
    assert a.inst.current.tolist() == [40, DRUMS, 42] and a.open[:, [60, 36, 48]].diag().all()
    a.select(torch.tensor([2, 0]))
    assert a.inst.current.tolist() == [42, 40]
    a.advance(torch.tensor([VIOLIN, CELLO]))  # each row's other instrument: nothing sounds there
    assert not a.open.any()
    a.advance(torch.tensor([CELLO, VIOLIN]))  # and back: the bank kept each row's notes
    assert a.open[0, 48] and a.open[1, 60] and a.open.sum() == 2


def test_generated_streams_with_instruments_decode_cleanly():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=BAND.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128)
    model = MusicTransformer(cfg).eval()
    with torch.no_grad():  # a random model that switches often, so that every rule is met
        model.head.weight[BAND.instrument_offset :] += 0.5 * model.head.weight[ON + 60]
    primer = prepare_primer(BAND, make_motif(), 4.0)
    params = SamplingParams(
        seconds=4.0, seed=1, num_samples=3, temperature=1.3, controls={"instruments": "any"}
    )
    (res,) = generate_batch(model, BAND, [(primer, params)])
    switches = 0
    for tokens in res.tokens:
        tokens = np.asarray(tokens, dtype=np.int64)
        inst = BAND.is_instrument(tokens)
        switches += int(inst.sum())
        nxt = tokens[np.flatnonzero(inst[:-1]) + 1]
        assert (BAND.is_note_on(nxt) | BAND.is_note_off(nxt) | ((nxt >= VEL) & (nxt < VEL + 32))).all()
        # every note-off closes a note of its instrument: none is an orphan the decoder would ignore
        current, bank = instrument_onsets(BAND, primer.tokens)
        sounding = {(i, p) for i, p in zip(*np.nonzero(bank > -(2**60)), strict=True)}
        for t in tokens.tolist():
            if BAND.is_instrument(t):
                current = t - BAND.instrument_offset
            elif BAND.is_note_on(t):
                sounding.add((current, t - ON))
            elif BAND.is_note_off(t):
                assert (current, t - OFF) in sounding
                sounding.discard((current, t - OFF))
    assert switches > 0


def test_the_motifs_instruments_play_by_default():
    # a violin and a cello in the motif: only they may play; drums and the piano wait
    grammar = Grammar(BAND, [np.array([VIOLIN, ON + 60, SHIFT + 9, CELLO, ON + 48])], [1000])
    allowed = _allowed(grammar)
    insts = allowed[BAND.instrument_offset :].nonzero().flatten() + BAND.instrument_offset
    assert insts.tolist() == [VIOLIN]  # the cello is current; nothing else
    low, high = RANGES[42]
    assert allowed[ON + low : ON + high + 1].all()  # the cello strikes (within its range)


def test_the_instruments_control_chooses_who_plays_and_closes_the_others_notes():
    rows = [Controls(instruments="Violin, drums").resolve(None, BAND.config.step_ms)]
    # the cello (current) sounds 48 but is not chosen: it may close it, strike nothing; drums may come in
    grammar = Grammar(BAND, [np.array([VIOLIN, ON + 60, SHIFT + 9, CELLO, ON + 48])], [1000], controls=rows)
    allowed = _allowed(grammar)
    assert not allowed[ON : ON + 128].any() and allowed[OFF + 48] and allowed[VIOLIN] and allowed[KIT]
    assert not allowed[BAND.instrument_offset]  # the piano: not chosen, nothing sounding
    grammar.advance(torch.tensor([OFF + 48]))
    grammar.advance(torch.tensor([VIOLIN]))
    assert not _allowed(grammar)[CELLO]  # nothing of the cello's left to close
    low, high = RANGES[40]
    assert _allowed(grammar)[ON + low : ON + high + 1].all()  # the violin strikes (within its range)


def test_the_instruments_control_is_refused_by_a_piano_model_and_checked():
    rows = [Controls(instruments="Violin").resolve(None, CODEC.config.step_ms)]
    with pytest.raises(GenerationError) as err:
        Grammar(CODEC, [np.array([CODEC.note_on_offset + 60])], [1000], controls=rows)
    assert err.value.code == "no_instruments"
    for word in ("motif", "any"):  # what a piano model does anyway: one stream, the motif's instrument
        rows = [Controls(instruments=word).resolve(None, CODEC.config.step_ms)]
        assert Grammar(CODEC, [np.array([CODEC.note_on_offset + 60])], [1000], controls=rows).inst is None
    assert Controls(instruments=" cello ,Violin, DRUMS").instruments == "40,42,drums"
    assert (
        Controls(instruments="ANY").instruments == "any" and Controls(instruments="motif").is_empty is False
    )
    for bad in ("", "kazoo", "128", 5):  # 128 is drums inside, not a program a user names
        with pytest.raises(ControlError) as err:
            Controls(instruments=bad)
        assert err.value.code == "invalid_controls"
    applied = Controls(instruments="42,40").resolve(None, 10).applied
    assert applied["instruments"] == ["Violin", "Cello"]


def test_a_continuation_keeps_to_the_motifs_instruments():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=BAND.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128)
    model = MusicTransformer(cfg).eval()
    with torch.no_grad():  # a random model that would switch often to anything
        model.head.weight[BAND.instrument_offset :] += 0.5 * model.head.weight[ON + 60]
    prompt = np.array(
        [VIOLIN, VEL + 20, ON + 60, SHIFT + 19, KIT, ON + 36, SHIFT + 19, OFF + 36, VIOLIN, OFF + 60]
    )
    primer = Primer(tokens=prompt, start_time=0.0, end_time=0.4, tempo=120.0, program=0, notes=[])
    heard = set()
    for controls, expected in ((None, {40, DRUMS}), ({"instruments": "drums"}, {DRUMS})):
        params = SamplingParams(seconds=4.0, seed=2, num_samples=3, temperature=1.3, controls=controls)
        (res,) = generate_batch(model, BAND, [(primer, params)])
        for tokens in res.tokens:
            notes = BAND.decode_instrument_notes(np.concatenate([primer.tokens, tokens]))
            played = {i for i, n in zip(notes.instruments, notes.notes, strict=True) if n.start >= 0.39}
            assert played <= expected
            heard |= played
    assert 40 in heard  # the model would play: the rule, not silence, keeps the others out


def test_the_uploads_tracks_may_all_play_even_those_silent_in_the_motif():
    """A Lied's voice enters after the piano's introduction: the default ("motif") is the upload's tracks."""
    from musicrel.generation.decode_job import continuation_job
    from musicrel.midi.tracks import Tracks, new_track

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=BAND.vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64, max_seq_len=128)
    model = MusicTransformer(cfg).eval()
    with torch.no_grad():  # a model keen on the cello
        model.head.weight[BAND.instrument_offset :] += 0.5 * model.head.weight[ON + 60]
        model.head.weight[CELLO] += 2.0 * model.head.weight[ON + 60]
    prompt = np.array(
        [VIOLIN, VEL + 20, ON + 60, SHIFT + 19, KIT, ON + 36, SHIFT + 19, OFF + 36, VIOLIN, OFF + 60]
    )
    tracks = Tracks([new_track(40), new_track(DRUMS), new_track(42)])  # the cello: silent so far
    primer = Primer(
        tokens=prompt, start_time=0.0, end_time=0.4, tempo=120.0, program=0, notes=[], tracks=tracks
    )
    job = continuation_job(model, BAND, primer, SamplingParams(seconds=4.0, seed=2))
    assert job.grammar.inst.permitted[0].nonzero().flatten().tolist() == [40, 42, DRUMS]
    heard, switched = set(), False
    (res,) = generate_batch(model, BAND, [(primer, SamplingParams(seconds=4.0, seed=2, num_samples=8))])
    for tokens in res.tokens:
        switched |= CELLO in np.asarray(tokens).tolist()
        notes = BAND.decode_instrument_notes(np.concatenate([primer.tokens, tokens]))
        played = {i for i, n in zip(notes.instruments, notes.notes, strict=True) if n.start >= 0.39}
        assert played <= {40, 42, DRUMS}
        heard |= played
    assert switched  # the cello comes in (without the tracks it could not: the test above)


def test_an_orchestral_instrument_strikes_within_its_range_or_the_prompt_s():
    """A violin strikes nothing under G3 (55) nor over its top, unless the prompt gives the violin such notes
    (then down to them); the piano strikes anything, the drums the percussion keys; the rule reads each row's
    own prompt and follows a switch of instrument."""
    low, high = RANGES[40]
    plain = np.array([VIOLIN, ON + 67, SHIFT + 9, OFF + 67])
    low_violin = np.array([VIOLIN, ON + 48, SHIFT + 9, OFF + 48])
    grammar = Grammar(BAND, [plain, low_violin], [1000, 1000], controls=_any(2))
    allowed = grammar.constrain(torch.zeros(2, BAND.vocab_size)).isfinite()
    assert allowed[0, ON + low : ON + high + 1].all()
    assert not allowed[0, ON : ON + low].any() and not allowed[0, ON + high + 1 : ON + 128].any()
    assert allowed[1, ON + 48 : ON + high + 1].all() and not allowed[1, ON : ON + 48].any()
    grammar.advance(torch.tensor([BAND.instrument_offset + 0, KIT]))  # a piano: anything; the drums
    allowed = grammar.constrain(torch.zeros(2, BAND.vocab_size)).isfinite()
    assert allowed[0, ON : ON + 128].all()
    kit_low, kit_high = RANGES[DRUMS]
    assert allowed[1, ON + kit_low : ON + kit_high + 1].all() and allowed[1, ON : ON + 128].sum() == 61


def test_a_batch_without_a_ranged_instrument_skips_the_range_rule():
    """A bass and a piano strike anything: their batch skips the rule (`any_range`); a violin joining turns
    it on, and its leaving turns it off again (drums have a range: the percussion keys)."""
    bass = BAND.instrument_offset + 33
    band = Grammar(BAND, [np.array([bass, ON + 36, SHIFT + 9, BAND.instrument_offset, ON + 60])], [1000])
    assert not band.inst.any_range
    band.extend(Grammar(BAND, [np.array([VIOLIN, ON + 67, SHIFT + 9])], [1000]))
    assert band.inst.any_range
    band.select(torch.tensor([0]))
    assert not band.inst.any_range


def _ensemble_prompt() -> np.ndarray:
    """10 s (1,000 steps): the kit strikes at 0 only; the cello at 600 and 800; the violin every 50 steps from
    850 to the end."""
    rest = [SHIFT + 99] * 6  # 600 steps
    prompt = [
        KIT,
        ON + 36,
        OFF + 36,
        *rest,
        CELLO,
        ON + 48,
        OFF + 48,
        SHIFT + 99,
        SHIFT + 99,
        ON + 48,
        OFF + 48,
    ]
    prompt += [SHIFT + 49, VIOLIN, ON + 60, OFF + 60]
    for _ in range(3):
        prompt += [SHIFT + 49, ON + 60, OFF + 60]
    return np.array(prompt)


def test_strike_gaps_read_each_instruments_last_strike_and_the_silence_it_may_keep():
    last, gap = strike_gaps(BAND, _ensemble_prompt(), 0.01)
    assert (last[DRUMS], last[42], last[40]) == (-1000, -200, 0)
    # the kit struck nothing in the last 5 s: never drawn back; the cello 1.5 x its 200-step gap; the
    # violin's 50-step gaps give the 1 s floor
    assert (gap[DRUMS], gap[42], gap[40]) == (_FOREVER, 300, 100)


def _switch_logprobs(grammar: Grammar) -> dict[str, float]:
    lp = grammar.constrain(torch.zeros(1, BAND.vocab_size))[0]
    return {"cello": float(lp[CELLO]), "kit": float(lp[KIT])}


def test_an_instrument_silent_past_its_gap_is_drawn_back_until_it_strikes():
    grammar = Grammar(BAND, [_ensemble_prompt()], [10_000])  # the motif's instruments; the violin plays
    first = _switch_logprobs(grammar)
    assert first["cello"] == pytest.approx(first["kit"])  # 200 steps of silence: within its 300
    grammar.advance(torch.tensor([SHIFT + 99]))
    grammar.advance(torch.tensor([SHIFT + 99]))  # 400 steps of silence: 1 s past its gap
    later = _switch_logprobs(grammar)
    assert later["cello"] - later["kit"] == pytest.approx(KEEP_SLOPE * 1.0, abs=1e-4)
    for _ in range(20):  # long silence: the pull is capped
        grammar.advance(torch.tensor([SHIFT + 99]))
    capped = _switch_logprobs(grammar)
    assert capped["cello"] - capped["kit"] == pytest.approx(KEEP_MAX_NATS, abs=1e-4)
    grammar.advance(torch.tensor([CELLO]))
    grammar.advance(torch.tensor([ON + 50]))  # the cello strikes, still sounding, and the violin takes over
    grammar.advance(torch.tensor([VIOLIN]))
    grammar.advance(torch.tensor([SHIFT + 49]))
    struck = _switch_logprobs(grammar)
    assert struck["cello"] == pytest.approx(struck["kit"])


def test_an_instrument_holding_a_note_is_not_silent():
    # the cello strikes 43 and holds it 4 s to the prompt's end, the violin takes over
    prompt = np.concatenate([_ensemble_prompt(), [CELLO, ON + 43, *[SHIFT + 99] * 4, VIOLIN]])
    grammar = Grammar(BAND, [prompt], [10_000])
    grammar.advance(torch.tensor([SHIFT + 99]))  # 500 steps since its strike, past its 300-step gap
    held = _switch_logprobs(grammar)
    assert bool(grammar.inst.sounding[0, 42]) and held["cello"] == pytest.approx(held["kit"])
