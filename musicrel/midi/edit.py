"""An edited file written into the upload's own bytes: `edited(source, before, after)` takes the file a user
sent (`source`, read as `before`) and the same file with some notes removed and others added (`after`: an
infill's answer), and writes only those notes into the upload's own MIDI messages. Everything pretty_midi
does not keep stays as it was: markers, copyright, text, SysEx, sequencer events, ports, every controller at
its tick, the tempo map to the microsecond, the track layout (empty tracks, a track that changes program,
several channels in one track, a type-0 file). `written` is the file a caller sends back: the edit, or
pretty_midi's rewrite where the edit cannot be made exactly (checked by reading it back)."""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from dataclasses import dataclass

import mido
import pretty_midi


@dataclass(frozen=True)
class _Note:
    """A note as pretty_midi pairs it: its instrument's key (program, channel, track), pitch, ticks and
    velocity, and where its messages are (the track's message indices)."""

    key: tuple[int, int, int]
    pitch: int
    start: int
    end: int
    velocity: int
    on: int
    off: int


def _paired(track, t: int) -> list[_Note]:
    """The notes of track `t`, paired as pretty_midi pairs them (`PrettyMIDI._load_instruments`): a note-off
    closes every open note-on of its channel and pitch that began at another tick, and the note's instrument
    is the program in effect on its channel at the note-off."""
    notes, program = [], [0] * 16
    open_ons: dict[tuple[int, int], list[tuple[int, int, int]]] = defaultdict(list)
    tick = 0
    for index, msg in enumerate(track):
        tick += msg.time
        if msg.type == "program_change":
            program[msg.channel] = msg.program
        elif msg.type == "note_on" and msg.velocity > 0:
            open_ons[(msg.channel, msg.note)].append((tick, msg.velocity, index))
        elif msg.type in ("note_on", "note_off") and (msg.channel, msg.note) in open_ons:
            waiting = open_ons[(msg.channel, msg.note)]
            closed = [w for w in waiting if w[0] != tick]
            for start, velocity, on in closed:
                key = (program[msg.channel], msg.channel, t)
                notes.append(_Note(key, msg.note, start, tick, velocity, on, index))
            kept = [w for w in waiting if w[0] == tick]
            if closed and kept:
                open_ons[(msg.channel, msg.note)] = kept
            else:
                del open_ons[(msg.channel, msg.note)]
    return notes


def _instruments(tracks) -> dict[tuple, list[_Note]]:
    """{(program, channel, track): its notes}, in the order pretty_midi makes its instruments (a key's first
    note closed), the track counted among the non-empty ones, as `midi.notes.read` hands them over."""
    found: dict[tuple, list[_Note]] = {}
    live = [t for t in tracks if len(t)]
    for t, track in enumerate(live):
        for note in _paired(track, t):
            found.setdefault(note.key, []).append(note)
    return found


def _times(inst: pretty_midi.Instrument) -> Counter:
    return Counter((n.pitch, n.start, n.end, n.velocity) for n in inst.notes)


class _Upload:
    """The upload's messages parsed and its notes paired once, for the edit of every sample; `valid` False
    where `before` is not what `source` reads as."""

    def __init__(self, source: bytes, before: pretty_midi.PrettyMIDI):
        self.mf = mido.MidiFile(file=io.BytesIO(source))
        self.live = [i for i, t in enumerate(self.mf.tracks) if len(t)]
        self.found = _instruments(self.mf.tracks)
        self.before = before
        clock = before._PrettyMIDI__tick_to_time  # tick -> seconds, as pretty_midi read the notes
        self.valid = len(self.found) == len(before.instruments) and max(
            (n.end for notes in self.found.values() for n in notes), default=0
        ) < len(clock)  # else `before` is another file
        # each instrument's notes as pretty_midi gave them (seconds), which `before` must hold
        self.mine = []
        for (key, notes), was in zip(self.found.items(), before.instruments, strict=False):
            if not self.valid:
                break
            program, channel, _ = key
            mine = Counter((n.pitch, clock[n.start], clock[n.end], n.velocity) for n in notes)
            kind = (was.program, was.is_drum) == (program, channel == 9)
            self.valid = self.valid and kind and mine == _times(was)
            self.mine.append(mine)
        self.clock = clock

    def edit(self, after: pretty_midi.PrettyMIDI) -> bytes | None:
        """The upload with the notes `after` differs from `before` by removed and added (`edited`)."""
        if not self.valid or len(after.instruments) != len(self.before.instruments):
            return None
        clock, tracks = self.clock, list(self.mf.tracks)  # this sample's own list: the upload's stays
        removed: dict[int, set[int]] = defaultdict(set)  # track (all tracks' index) -> message indices
        closing: dict[int, set[int]] = defaultdict(set)  # track -> note-offs that close a kept note
        added: dict[int, list[tuple]] = defaultdict(list)  # track -> (tick, rank, message)
        expected: dict[tuple, Counter] = {}  # every instrument's notes in ticks, as they must read back
        for (key, notes), mine, was, now in zip(
            self.found.items(), self.mine, self.before.instruments, after.instruments, strict=True
        ):
            _, channel, t = key
            if (now.program, now.is_drum) != (was.program, was.is_drum):
                return None
            wanted = _times(now)
            gone, new = mine - wanted, wanted - mine
            track = self.live[t]
            ticks = expected[key] = Counter()
            for n in notes:
                heard = (n.pitch, clock[n.start], clock[n.end], n.velocity)
                if gone[heard] > 0:
                    gone[heard] -= 1
                    removed[track] |= {n.on, n.off}
                else:
                    closing[track].add(n.off)
                    ticks[(n.pitch, n.start, n.end, n.velocity)] += 1
            for pitch, start, end, velocity in new.elements():
                a, b = after.time_to_tick(start), after.time_to_tick(end)
                if b <= a:
                    return None
                ticks[(pitch, a, b, velocity)] += 1
                # the note-off first at its tick (a note struck again there closes the old one first), the
                # note-on after what the tick already holds (a program change there is this note's)
                on = mido.Message("note_on", channel=channel, note=pitch, velocity=velocity)
                off = mido.Message("note_off", channel=channel, note=pitch, velocity=0)
                added[track] += [(b, 0, off), (a, 2, on)]
        for track in set(removed) | set(added):
            tracks[track] = _rewritten(tracks[track], removed[track] - closing[track], added[track])
        # read back as pretty_midi would: the same instruments in the same order, each with exactly the notes
        # asked for (a removed note-off shared with another instrument's note would show here)
        again = _instruments(tracks)
        if list(again) != list(self.found) or any(
            Counter((n.pitch, n.start, n.end, n.velocity) for n in again[key]) != ticks
            for key, ticks in expected.items()
        ):
            return None
        mf = mido.MidiFile(type=self.mf.type, ticks_per_beat=self.mf.ticks_per_beat, charset=self.mf.charset)
        mf.tracks = tracks
        out = io.BytesIO()
        mf.save(file=out)
        return out.getvalue()


def edited(source: bytes, before: pretty_midi.PrettyMIDI, after: pretty_midi.PrettyMIDI) -> bytes | None:
    """`source` with the notes `after` differs from `before` by (the file `source` is, read) removed and
    added, every other message as it was; None where that cannot be done exactly: `after` has other
    instruments, `before` is not what `source` reads as, or a new note would be read back as another
    instrument's or paired with another note (a track that changes program inside the span, say)."""
    return _Upload(source, before).edit(after)


def _rewritten(track, removed: set[int], added: list[tuple]) -> mido.MidiTrack:
    """`track` without the messages at `removed` and with `added` ((tick, rank, message)) in place, its
    end-of-track last (moved later if a new note ends after it). A kept message is copied only where its
    delta time changes."""
    events, tick, end = [], 0, 0
    for index, msg in enumerate(track):
        tick += msg.time
        if msg.type == "end_of_track":
            end = max(end, tick)
        elif index not in removed:
            events.append((tick, 1, index, msg))
    events += [(t, rank, -1, msg) for t, rank, msg in added]
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    out, now = mido.MidiTrack(), 0
    for t, _, _, msg in events:
        out.append(msg if msg.time == t - now else msg.copy(time=t - now))
        now = t
    out.append(mido.MetaMessage("end_of_track", time=max(end, now) - now))
    return out


def written(source: bytes | None, before: pretty_midi.PrettyMIDI, afters: list) -> list[bytes]:
    """The files to send back for `afters` (each sample's PrettyMIDI): `source` edited (`edited`; the upload
    parsed once for them all) where it can be, else pretty_midi's rewrite (also where there is no `source`:
    a PrettyMIDI given, not a file)."""
    try:
        upload = None if source is None else _Upload(source, before)
    except Exception:  # noqa: BLE001  (mido's errors on a file pretty_midi read: the rewrite always serves)
        upload = None
    files = []
    for after in afters:
        try:
            data = None if upload is None else upload.edit(after)
        except Exception:  # noqa: BLE001  (as above)
            data = None
        if data is None:
            out = io.BytesIO()
            after.write(out)
            data = out.getvalue()
        files.append(data)
    return files
