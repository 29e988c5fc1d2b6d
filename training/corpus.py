"""Export the corpus that ships inside the `music21` package to MIDI files.

Every work music21 knows (`corpus.getPaths()`) becomes one MIDI file under OUT, mirroring the corpus folders;
multi-tune ABC files (Essen, O'Neill's, Ryan's, Nottingham, ...) become one file per tune (`erk30-X0012.mid`),
each parsed from its own text (the file's header + its `X:` section). Works are converted in worker processes;
outputs that exist are skipped, so an interrupted export resumes where it stopped. Failures are counted and
listed in OUT/corpus_report.json.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from musicrel.errors import MusicrelError

REPORT_NAME = "corpus_report.json"
# A few scores make music21 crawl for minutes; one stuck work must not stall the export.
WORK_TIMEOUT_S = 180
TICKS_PER_QUARTER = 960
# Roman-numeral analyses (.rntxt) are harmonic annotations of pieces the corpus also holds, not music to
# learn.
_NOT_SCORES = (".rntxt",)
_PREFERRED = (".mxl", ".musicxml", ".xml", ".krn", ".abc")
_SMALL = 60_000  # estimated bytes of score text: parsed in seconds
_COMPRESSED = 8  # .mxl is zipped MusicXML: weigh its size as the text it holds
_ABC_NUMBER = re.compile(r"^X:\s*(\d+)", flags=re.MULTILINE)


def _music21():
    try:
        import music21
    except ImportError:
        raise MusicrelError(
            "music21 is not installed: pip install 'musicrel[corpus]'", code="missing_dependency"
        ) from None
    return music21


@dataclass(frozen=True)
class Work:
    path: str  # absolute path of the corpus file
    number: int | None  # ABC tune number (X:) for multi-tune files, else None
    out: str  # output path relative to OUT


def list_works(limit: int | None = None) -> list[Work]:
    """Every work of the music21 corpus, one entry per tune of multi-tune ABC files, cheapest first.

    music21's parse time grows with the size of a score (a Beethoven quartet takes minutes, a folk tune tens
    of milliseconds), so works are ordered by an estimate of their size: an export cut short (or `--limit`)
    yields as many pieces as possible, from every collection, and the few giant scores come last."""
    music21 = _music21()
    paths = sorted(Path(p) for p in music21.corpus.getPaths())
    root = Path(music21.corpus.__file__).resolve().parent
    costed: list[tuple[float, Work]] = []
    for path in paths:
        if path.suffix.lower() in _NOT_SCORES:
            continue
        try:
            rel = path.resolve().relative_to(root)
        except ValueError:  # a user-registered local corpus outside the package
            rel = Path(path.name)
        stem = rel.with_suffix("")
        size = path.stat().st_size * (_COMPRESSED if path.suffix.lower() == ".mxl" else 1)
        numbers: list[int] = []
        if path.suffix.lower() == ".abc":
            text = path.read_text(encoding="utf-8", errors="replace")
            numbers = sorted({int(n) for n in _ABC_NUMBER.findall(text)})
        if len(numbers) > 1:
            costed += [(size / len(numbers), Work(str(path), n, f"{stem}-X{n:04d}.mid")) for n in numbers]
        else:
            costed.append((size, Work(str(path), None, f"{stem}.mid")))
    # The same piece sometimes ships twice (opus18no1/movement3 as .krn and .mxl): keep the preferred format.
    best: dict[str, tuple[float, Work]] = {}
    for cw in costed:
        other = best.get(cw[1].out)
        if other is None or _rank(cw[1]) < _rank(other[1]):
            best[cw[1].out] = cw
    costed = sorted(best.values(), key=lambda cw: (cw[0], cw[1].out))
    # Small works first, taken in turn from each collection (so that Bach and Palestrina are not queued behind
    # 8000 Essen tunes); then the big scores, smallest first.
    groups: dict[str, list[Work]] = {}
    for cost, w in costed:
        if cost <= _SMALL:
            groups.setdefault(Path(w.out).parts[0], []).append(w)
    small = [w for group in itertools.zip_longest(*groups.values()) for w in group if w is not None]
    works = small + [w for cost, w in costed if cost > _SMALL]
    return works if limit is None else works[:limit]


def _rank(work: Work) -> int:
    suffix = Path(work.path).suffix.lower()
    return _PREFERRED.index(suffix) if suffix in _PREFERRED else len(_PREFERRED)


def abc_tune(path: str, number: int) -> str:
    """The text of tune X:`number` of a multi-tune ABC file, after the file's header (the fields before the
    first X:, which apply to every tune)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    starts = [(m.start(), int(m.group(1))) for m in _ABC_NUMBER.finditer(text)]
    for i, (pos, n) in enumerate(starts):
        if n == number:
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            return text[: starts[0][0]] + text[pos:end]
    raise ValueError(f"no tune X:{number} in {path}")


def _write_midi(score, path: Path) -> None:
    from music21 import exceptions21, meter

    try:
        score.write("midi", fp=str(path))
    except exceptions21.StreamException as exc:
        # ~5 % of the ABC tunes (200 of Essen's han2.abc) hold one TimeSignature object in two places, and
        # music21's MIDI writer then fails to gather them into its conductor track. The codec reads seconds,
        # not meter: drop the time signatures and write again.
        if "already found" not in str(exc):
            raise
        for container in score.recurse(streamsOnly=True, includeSelf=True):
            container.removeByClass(meter.TimeSignature)
        score.write("midi", fp=str(path))


def _timeout(signum, frame):
    raise TimeoutError(f"took more than {WORK_TIMEOUT_S} s")


def _export_one(args: tuple[Work, str]) -> tuple[str, str | None]:
    """Worker: parse one work and write it (atomically). Returns (status, error)."""
    work, out_dir = args
    out = Path(out_dir) / work.out
    if out.exists():
        return "existing", None
    import warnings

    warnings.simplefilter("ignore")
    from music21 import converter, corpus, defaults, stream

    # music21 writes 10080 ticks per quarter: a long folk tune then passes the codec's max_ticks cap on
    # hostile files. 960 keeps triplets and quintuplets exact, far below the codec's 10 ms grid.
    defaults.ticksPerQuarter = defaults.ticksAtStart = TICKS_PER_QUARTER

    use_alarm = hasattr(signal, "SIGALRM")
    if use_alarm:
        signal.signal(signal.SIGALRM, _timeout)
        signal.alarm(WORK_TIMEOUT_S)
    try:
        if work.number is None:
            parsed = corpus.parse(work.path, forceSource=True)
        else:  # the tune alone: corpus.parse(path, number=N) reads the whole file for each tune
            parsed = converter.parse(abc_tune(work.path, work.number), format="abc")
        scores = list(parsed.scores) if isinstance(parsed, stream.Opus) else [parsed]
        if not scores:
            return "failed", "EmptyOpus: the file holds no score"
        out.parent.mkdir(parents=True, exist_ok=True)
        # An opus found in a file we did not split gets one output per score; the first keeps the
        # plain name so that "the output exists" stays the resume test.
        for i, score in enumerate(scores):
            target = out if i == 0 else out.with_name(f"{out.stem}-{i + 1}.mid")
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            _write_midi(score, tmp)
            os.replace(tmp, target)
        return "exported", None
    except Exception as exc:  # music21 raises anything from its many parsers; count it and go on
        return "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    finally:
        if use_alarm:
            signal.alarm(0)


def export_music21(
    out_dir: str | Path, workers: int | None = None, limit: int | None = None, progress: bool = True
) -> dict:
    """Export the music21 corpus to MIDI under out_dir; returns (and writes) the report."""
    music21 = _music21()
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    works = list_works(limit)
    workers = max(1, workers or os.cpu_count() or 1)
    counts = {"exported": 0, "existing": 0, "failed": 0}
    failures = []
    start = time.perf_counter()
    jobs = [(w, str(out_dir)) for w in works]
    bar = tqdm(
        total=len(works),
        desc="music21 -> MIDI",
        unit="work",
        disable=not progress,
        mininterval=0.5 if sys.stderr.isatty() else 30,
    )
    if workers == 1:
        results = map(_export_one, jobs)
        executor = None
    else:
        executor = ProcessPoolExecutor(max_workers=workers)
        results = executor.map(_export_one, jobs, chunksize=4)
    try:
        for work, (status, error) in zip(works, results, strict=True):
            counts[status] += 1
            if error is not None:
                failures.append({"path": work.path, "number": work.number, "out": work.out, "error": error})
            bar.update(1)
            bar.set_postfix(failed=counts["failed"], refresh=False)
    finally:
        bar.close()
        if executor is not None:
            executor.shutdown(cancel_futures=True)
    report = {
        "source": "music21",
        "music21_version": music21.__version__,
        "works": len(works),
        **counts,
        "seconds": round(time.perf_counter() - start, 1),
        "failures": failures,
    }
    (out_dir / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    return report
