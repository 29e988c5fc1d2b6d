"""The library's one-call continuation: `continue_midi`, a motif in (path, bytes or PrettyMIDI) and one MIDI
file per sample out. It parses the primer (`primer.prepare_primer`), decodes it as one continuation job on
the decode loop (`decode_batch.generate_batch`) and renders the tokens (`primer.render_result`).
`from musicrel import continue_midi` is this function."""

from __future__ import annotations

import pretty_midi

from musicrel.generation.decode_batch import generate_batch
from musicrel.generation.primer import (
    PRIMER_SECONDS,
    default_max_primer_tokens,
    prepare_primer,
    refuse_program,
    render_result,
)
from musicrel.generation.sampling import SamplingParams
from musicrel.midi.codec import EventCodec

# continue_midi's own defaults: a reproducible pair of samples (SamplingParams draws one random seed).
CONTINUE_MIDI_DEFAULTS = {"seed": 0, "num_samples": 2}


def continue_midi(
    model,
    midi,
    *,
    primer_seconds: float = PRIMER_SECONDS,
    tracks="merge",
    codec=None,
    **sampling,
) -> list[pretty_midi.PrettyMIDI]:
    """Continue `midi` (path, bytes or PrettyMIDI); one PrettyMIDI per sample. `sampling`: SamplingParams
    fields (seconds, temperature, top_k, top_p, seed, num_samples, max_new_tokens, include_primer, controls),
    whose defaults are SamplingParams' but for CONTINUE_MIDI_DEFAULTS. With a model whose codec has
    instruments each file keeps the motif's tracks (docs/INSTRUMENTS.md), and `program` is refused
    (ControlError program_with_instruments)."""
    codec = codec or EventCodec()
    params = SamplingParams(**{**CONTINUE_MIDI_DEFAULTS, **sampling})
    primer = prepare_primer(codec, midi, primer_seconds, tracks, max_tokens=default_max_primer_tokens(model))
    refuse_program(primer, params.controls)
    result = generate_batch(model, codec, [(primer, params)])[0]
    return render_result(codec, primer, result, params.include_primer)
