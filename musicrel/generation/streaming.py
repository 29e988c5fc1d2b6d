"""Generated tokens -> note events while they are generated, so a continuation can be played as it grows.

`NoteStream` follows one sample's tokens as they arrive and says when each note starts (`on`, at its
note-on, its end still unknown) and when it ends (`off`). It decodes exactly as `render` does (the codec's
decoder over primer + continuation), so the notes it reports are the notes of the MIDI file written for the
same tokens (pedal changes aside: those are in the file only):

- the velocity in force carries over from the primer, and notes struck in the primer, on its last step
  too, are not the continuation's (their note-offs are silent here); its clock starts at the cut,
  `tail_steps` after the primer's last token (`musicrel.generation.join`);
- a re-strike closes the sounding note of its pitch; struck again on the very step it began, the first strike
  is dropped (`drop`: it is not in the file);
- a note-off on its note-on's own step gives a one-step note, unless the pitch is struck again on that step,
  which cuts it to nothing. Such an end is reported only once time moves on, when it can no longer change;
- `close()` ends what still sounds at the final time; a note struck on that very step has no length and is
  dropped.

With a codec that has instruments the notes are keyed by (instrument, pitch), as the decoder keys them, and
each `on` says its instrument and, given a `Placer` (`musicrel.midi.tracks`), its track: placed in the
order the onsets come, which is the order `render` places them in, since it reads the same events. A note
the placer puts on no track (an infill's note of an instrument no chosen track plays, `span.gap_placer`) is
not the answer's and is never reported. A track that doubles the note's track in unison (`Placer.copies`)
gets a copy: a note of its own, with the next id, reported with the note it copies (`on`, `off`, `drop`).

Why onsets and not whole notes: tokens come in time order, so onsets arrive in the order they are to be
played, a few tokens after generation reaches them. A whole note is known only at its note-off, and a long
note would arrive after the short notes struck later than it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from musicrel.midi.codec import EventCodec
from musicrel.midi.tracks import Placer


@dataclass(frozen=True)
class NoteEvent:
    kind: str  # "on" (a note starts; velocity and pitch given), "off" (it ends at `time`), "drop" (no note)
    id: int  # numbers the sample's notes in the order they start
    pitch: int
    time: float  # seconds from the start of the continuation: the start for "on", the end for "off"
    velocity: int = 0
    instrument: int | None = None  # a codec with instruments: the note's (program 0..127, DRUMS)
    track: int | None = None  # with a Placer: the note's track (musicrel.midi.tracks)


class NoteStream:
    """One sample's note events, fed its generated tokens chunk by chunk (`feed`), then `close()`."""

    def __init__(
        self, codec: EventCodec, primer_tokens, tail_steps: int = 0, placer: Placer | None = None
    ) -> None:
        """tail_steps: `Primer.tail_steps`, the silence between the primer's last token and the cut: the
        continuation's clock starts there (generation.join), and what is struck before it is not heard.
        placer: where each note goes (`Tracks.placer`, its times from the cut), for a codec with
        instruments."""
        self.codec = codec
        self.step = codec.step
        self._off0, self._shift0 = codec.note_off_offset, codec.time_shift_offset
        self._vel0 = codec.velocity_offset
        self._vel_end = self._vel0 + codec.config.velocity_bins
        self._bin_velocity = codec._bin_velocity.tolist()
        self._inst_lo = codec.instrument_offset if codec.instrument_offset is not None else -1
        self._inst_hi = self._inst_lo + codec.num_instruments if self._inst_lo >= 0 else -1
        self._base = 0  # the instrument in effect x 128: notes are keyed by voice = instrument x 128 + pitch
        self.placer = placer
        self._tracks: dict[int, int] = {}  # note id -> its track
        self._copies: dict[int, list[int]] = {}  # note id -> the ids of its copies on the tracks doubling it
        self.t = 0  # steps, primer included
        self.velocity = 64
        self._open: dict[int, tuple[int, int, int | None]] = {}  # voice -> (start step, velocity, id or None)
        self._one_step: dict[int, int] = {}  # voice -> id of a note closed on its own start step (this step)
        self._ids = 0
        self._closed = False
        self._events: list[NoteEvent] = []
        self._live = False  # reading the primer: its notes are not the continuation's, nothing is reported
        self.feed(primer_tokens)
        self.t0 = self.t + int(tail_steps)  # the cut
        self._live = True

    def _seconds(self, step: int) -> float:
        return (step - self.t0) * self.step

    def _emit(self, kind: str, note_id: int | None, voice: int, step: int, velocity: int = 0) -> None:
        if note_id is None:
            return
        instrument = voice // 128 if self._inst_lo >= 0 else None
        pitch, time = voice % 128, self._seconds(step)
        for i in (note_id, *self._copies.get(note_id, ())):
            self._events.append(NoteEvent(kind, i, pitch, time, velocity, instrument, self._tracks.get(i)))

    def feed(self, tokens) -> list[NoteEvent]:
        """The events the new tokens complete, in order."""
        if self._closed:
            raise ValueError("the stream is closed")
        for tok in np.asarray(tokens, dtype=np.int64).reshape(-1).tolist():
            if tok < 0:
                continue
            if tok < self._off0:
                self._note_on(self._base + tok)
            elif tok < self._shift0:
                self._note_off(self._base + tok - self._off0)
            elif tok < self._vel0:
                self._flush_one_step()
                self.t += tok - self._shift0 + 1
            elif tok < self._vel_end:
                self.velocity = self._bin_velocity[tok - self._vel0]
            elif self._inst_lo <= tok < self._inst_hi:
                self._base = (tok - self._inst_lo) * 128
        events, self._events = self._events, []
        return events

    def close(self) -> list[NoteEvent]:
        """The end of the sample: what still sounds ends now (a note struck on this very step is dropped)."""
        if self._closed:
            return []
        for voice, note_id in self._one_step.items():  # one step would pass the end: cut to nothing
            self._emit("drop", note_id, voice, self.t)
        self._one_step.clear()
        for voice, (start, _, note_id) in sorted(self._open.items(), key=lambda kv: kv[1][0]):
            self._emit("off" if start < self.t else "drop", note_id, voice, self.t)
        self._open.clear()
        self._closed = True
        events, self._events = self._events, []
        return events

    def _note_on(self, voice: int) -> None:
        prev = self._open.pop(voice, None)
        if prev is not None:
            start, _, prev_id = prev
            self._emit("off" if start < self.t else "drop", prev_id, voice, self.t)
        cut = self._one_step.pop(voice, None)
        if cut is not None:  # the one-step note ends where this one starts: on its own start, so no note
            self._emit("drop", cut, voice, self.t)
        self._open[voice] = (self.t, self.velocity, self._strike(voice, self.velocity))

    def _strike(self, voice: int, velocity: int) -> int | None:
        """A new note's id (None in the primer or before the cut: `render` drops it; or where the placer puts
        it on no track: the infill's answer leaves it out), its onset reported."""
        if not self._live or self.t < self.t0:
            return None
        note_id = self._ids
        if self.placer is not None:  # placed at its onset, in the order onsets come
            track = self.placer.place(voice // 128, voice % 128)
            if track is None:
                return None
            self._tracks[note_id] = track
            copies = self.placer.copies(track)
            if copies:
                self._copies[note_id] = list(range(note_id + 1, note_id + 1 + len(copies)))
                self._tracks.update(zip(self._copies[note_id], copies, strict=True))
        self._ids += 1 + len(self._copies.get(note_id, ()))
        self._emit("on", note_id, voice, self.t, velocity)
        return note_id

    def _note_off(self, voice: int) -> None:
        prev = self._open.pop(voice, None)
        if prev is None:
            return
        start, _, note_id = prev
        if start < self.t:
            self._emit("off", note_id, voice, self.t)
        elif note_id is not None:
            self._one_step[voice] = note_id  # one step long unless struck again on this step

    def _flush_one_step(self) -> None:
        for voice, note_id in self._one_step.items():
            self._emit("off", note_id, voice, self.t + 1)
        self._one_step.clear()
