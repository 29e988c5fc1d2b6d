"""The generation fuzz: valid requests steered to the edges of generation, where outputs degenerate.

The schema fuzz (tests/server/test_api_fuzz.py) draws fields from the OpenAPI document, so it rarely asks
for what empties a sample: samples with fewer than two notes failed every request they were in with a 500
(the novelty record had no start time) and schemathesis never got there. Here every case is a request the
server must answer without a 5xx: tiny `seconds` and primers, near-zero density, extreme temperatures and
nucleus masses, every control (key and chords that disagree, one-pitch ranges, a polyphony of one),
motifs of one note or one chord, motifs cut anywhere (`motif_end`), on the three answers (MIDI, JSON,
NDJSON stream). Run it against a checkpoint that ships a novelty index (`with_novelty_index`), or that
path is never taken.

`run` takes any httpx.Client (a TestClient in the test suite, a real server in `musicrel bench reliability
--fuzz-generation N`); the cases come from one seeded `random.Random`, so a failure is replayed by its seed
and index.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from musicrel.generation.controls import CHORD_QUALITIES, SCALES, gm_program_name

NOTE_NAMES = ("C", "C#", "Db", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B")
ENDPOINTS = {"json": 0.45, "midi": 0.2, "stream": 0.35}


def _midi(tracks: list[tuple[int, bool, list[tuple[int, float, float]]]], tempo: float = 100.0) -> bytes:
    import pretty_midi

    pm = pretty_midi.PrettyMIDI(initial_tempo=tempo)
    for program, is_drum, notes in tracks:
        inst = pretty_midi.Instrument(program=program, is_drum=is_drum)
        inst.notes = [pretty_midi.Note(80, pitch, start, end) for pitch, start, end in notes]
        pm.instruments.append(inst)
    buffer = io.BytesIO()
    pm.write(buffer)
    return buffer.getvalue()


def motifs() -> dict[str, bytes]:
    """Small motifs that reach the degenerate paths: one note, one chord, two notes, a long held note, a
    dense run, several instruments with drums, a motif whose notes all start late."""
    line = [(48 + (i * 7) % 24, 0.2 * i, 0.2 * i + 0.18) for i in range(16)]
    return {
        "line": _midi([(0, False, line)]),
        "one_note": _midi([(0, False, [(60, 0.0, 0.5)])]),
        "one_chord": _midi([(0, False, [(60, 0.0, 1.0), (64, 0.0, 1.0), (67, 0.0, 1.0)])]),
        "two_notes": _midi([(40, False, [(72, 0.0, 0.1), (74, 0.1, 0.2)])]),
        "held": _midi([(0, False, [(36, 0.0, 20.0), (79, 19.9, 20.0)])]),
        "dense": _midi([(0, False, [(40 + i % 48, 0.01 * i, 0.01 * i + 0.3) for i in range(600)])]),
        "band": _midi(
            [
                (122, False, [(84, 0.0, 4.0)]),
                (33, False, [(36 + i % 5, 0.5 * i, 0.5 * i + 0.4) for i in range(8)]),
                (0, False, line),
                (0, True, [(36, 0.25 * i, 0.25 * i + 0.1) for i in range(16)]),
            ],
            tempo=128,
        ),
        "late": _midi([(0, False, [(60 + i, 30.0 + 0.3 * i, 30.2 + 0.3 * i) for i in range(6)])]),
    }


def with_novelty_index(checkpoint: Path, folder: Path) -> Path:
    """A copy of `checkpoint` in `folder` with a novelty index of the fuzz's own motifs (so copies are found
    sometimes, and every sample, empty or not, goes through the novelty report)."""
    import pretty_midi

    from musicrel.evaluation.novelty import INDEX_FILE, NoveltyIndex

    shutil.copytree(checkpoint, folder, dirs_exist_ok=True)
    pieces = []
    for name, data in motifs().items():
        pm = pretty_midi.PrettyMIDI(io.BytesIO(data))
        pieces.append((name, [n for inst in pm.instruments if not inst.is_drum for n in inst.notes]))
    NoveltyIndex.build(pieces).save(folder / INDEX_FILE)
    return folder


def _key(rng: random.Random) -> str:
    if rng.random() < 0.3:
        return rng.choice(["auto", "AUTO", " auto "])
    return f"{rng.choice(NOTE_NAMES)}:{rng.choice(list(SCALES))}"


def _chords(rng: random.Random) -> str:
    chords = []
    for _ in range(rng.randint(1, 6)):
        root = rng.choice([n for n in NOTE_NAMES if n[0] in "ABCDEFG"])
        symbol = root + rng.choice(list(CHORD_QUALITIES))
        if rng.random() < 0.15:
            symbol += "/" + rng.choice(NOTE_NAMES)
        duration = rng.choice(["", ":0.01", ":0.1", ":1", ":2", ":4b", ":0.5b", ":60"])
        chords.append(symbol + duration)
    return rng.choice([" ", ", ", " | "]).join(chords)


def case(rng: random.Random, limits: dict[str, float], motif_names: list[str]) -> dict:
    """One request: its endpoint, its motif and its form fields (strings, as a form sends them)."""
    max_seconds = min(limits.get("seconds", 60.0), 3.0)  # long enough to end a sample, short enough to run
    fields: dict[str, str] = {"seed": str(rng.randrange(2**32))}

    def maybe(name: str, p: float, values: list) -> None:
        if rng.random() < p:
            fields[name] = str(rng.choice(values))

    tiny = [0.01, 0.02, 0.05, 0.1, 0.3, 0.5]
    fields["seconds"] = str(rng.choice([*tiny, round(rng.uniform(0.01, max_seconds), 3), max_seconds]))
    maybe("temperature", 0.6, [1e-30, 1e-6, 0.01, 0.1, 0.5, 1, 2, 5, 10])
    maybe("top_k", 0.3, [1, 2, 5, 50, int(limits.get("top_k", 256))])
    maybe("top_p", 0.4, [1e-30, 1e-6, 0.01, 0.3, 0.9, 1])
    maybe("num_samples", 0.5, list(range(1, int(limits.get("num_samples", 4)) + 1)))
    maybe("include_primer", 0.2, ["true", "false"])
    maybe("primer_seconds", 0.3, [0.01, 0.05, 0.5, 2, 30, limits.get("primer_seconds", 120)])
    maybe("motif_end", 0.25, [0.01, 0.1, 0.5, 1, 3, 20, 3600])  # before the first note: 422 no_notes
    maybe("tracks", 0.15, ["merge", "0", "all"])
    maybe("program", 0.3, [0, 40, 127, gm_program_name(rng.randrange(128)), "violin", ""])
    if rng.random() < 0.35:
        fields["key"] = _key(rng)
        maybe("key_strength", 0.6, ["prefer", "only", "0", "20", "7.5"])
    if rng.random() < 0.35:
        fields["chords"] = _chords(rng)
        maybe("chord_strength", 0.6, ["prefer", "only", "0", "20", "0.5"])
    maybe("density", 0.35, [0.001, 0.01, 0.05, 0.1, 1, 10, 40])
    if rng.random() < 0.25:
        low = rng.choice([0, 21, 59, 60, 72, 100, 127])
        fields["low_note"] = str(low)
        if rng.random() < 0.7:
            fields["high_note"] = str(min(127, low + rng.choice([0, 0, 1, 2, 11, 40])))
    maybe("max_polyphony", 0.25, [1, 2, 3, 128])
    endpoint = rng.choices(list(ENDPOINTS), weights=list(ENDPOINTS.values()))[0]
    return {"endpoint": endpoint, "motif": rng.choice(motif_names), "fields": fields}


@dataclass
class Report:
    sent: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)  # "200", "422 empty_range"
    failures: list[str] = field(default_factory=list)  # what went wrong, with the case that did it
    empty_samples: int = 0  # samples with fewer than two notes: the outputs this fuzz is here to reach

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status.startswith("5"))


def _check_samples(samples: list[dict]) -> tuple[list[str], int]:
    """Problems with the samples of a JSON result (each a MIDI file with the notes it claims), and how many
    of them have fewer than two notes."""
    import pretty_midi

    problems, empty = [], 0
    for s in samples:
        pm = pretty_midi.PrettyMIDI(io.BytesIO(base64.b64decode(s["midi_base64"])))
        notes = sum(len(inst.notes) for inst in pm.instruments)
        if notes != s["notes"]:
            claimed = s["notes"]
            problems.append(f"sample {s['index']}: its MIDI holds {notes} notes, the answer says {claimed}")
        empty += s["notes"] < 2
    return problems, empty


def _judge(endpoint: str, response, report: Report) -> list[str]:
    """Count the answer; what is wrong with it (a 5xx, a stream that ends in an error, ...)."""
    status = response.status_code
    if status != 200 or endpoint == "midi":
        code = ""
        if status != 200:
            try:
                code = response.json()["error"]["code"]
            except (ValueError, KeyError, TypeError):
                return [f"{status} without a JSON error body: {response.text[:200]!r}"]
        report.statuses[f"{status} {code}".strip()] += 1
        if status >= 500:
            return [f"{status} {code}: {response.text[:300]}"]
        if status == 200 and not response.content.startswith(b"MThd"):
            return ["a MIDI answer that is not a MIDI file"]
        return []
    if endpoint == "stream":
        lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        last = lines[-1] if lines else {}
        if last.get("type") == "error":
            report.statuses[f"{last['status']} {last['error']['code']} (stream)"] += 1
            return [f"the stream ended with an error line: {json.dumps(last)[:300]}"]
        if last.get("type") != "result":
            return [f"the stream ended without a result: {response.text[-300:]!r}"]
        body = last
    else:
        body = response.json()
    report.statuses["200"] += 1
    problems, empty = _check_samples(body["samples"])
    report.empty_samples += empty
    return problems


def run(client, n: int, seed: int, motif_files: dict[str, bytes] | None = None, progress=None) -> Report:
    """Send `n` cases (seeded by `seed`) one after another through `client` (an httpx.Client on the server's
    base URL) and judge every answer."""
    rng = random.Random(seed)
    files = motif_files or motifs()
    model = client.get("/v1/model").json()
    limits = {
        "seconds": model["limits"]["max_seconds"],
        "primer_seconds": model["limits"]["max_primer_seconds"],
        "num_samples": model["limits"]["max_num_samples"],
        "top_k": model["vocab_size"],
    }
    report = Report()
    paths = {"json": "/v1/continuations", "midi": "/v1/continuations", "stream": "/v1/continuations/stream"}
    for i in range(n):
        c = case(rng, limits, sorted(files))
        headers = {"accept": "application/json"} if c["endpoint"] == "json" else {}
        response = client.post(
            paths[c["endpoint"]],
            files={"file": ("motif.mid", files[c["motif"]], "audio/midi")},
            data=c["fields"],
            headers=headers,
        )
        report.sent += 1
        for problem in _judge(c["endpoint"], response, report):
            report.failures.append(f"case {i} (seed {seed}) {c}: {problem}")
        if progress is not None:
            progress(i + 1, report)
    return report
