"""The reports' piano rolls draw a band's drum hits as diamonds on a lane of their own (report.html's SVG and
the pianorolls picture), and a piano model's rolls exactly as before; evaluate-continuations' examples carry
the hits (`_example_drums`)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pretty_midi
from matplotlib.figure import Figure

from musicrel.evaluation.continuations import _example_drums
from musicrel.evaluation.plots import _drum_lane, plot_pianorolls
from musicrel.evaluation.report_html import DRUM_LANE, ROLL_HEIGHT, _continuation_line, piano_roll_svg
from musicrel.midi.instruments import DRUMS

MOTIF = [[60, -2.0, -1.5, 80], [64, -1.0, -0.5, 100]]
NOTES = [[67, 0.0, 0.5, 90], [48, 0.5, 1.0, 60]]
MOTIF_HITS = [[36, -2.0, -1.9, 100], [42, -1.5, -1.45, 60], [38, -1.0, -0.9, 110]]
HITS = [[36, 0.0, 0.1, 100], [42, 0.25, 0.3, 50]]


def rects(svg: str) -> list[tuple[float, float]]:
    """(y, height) of every note bar (the background rect has no y)."""
    return [
        (float(y), float(h)) for y, h in re.findall(r'<rect x="[^"]+" y="([^"]+)" [^>]*height="([^"]+)"', svg)
    ]


def test_a_roll_without_drums_is_as_before():
    svg = piano_roll_svg(MOTIF, NOTES, "#1f77b4", 2.0, 1.0)
    assert svg == piano_roll_svg(MOTIF, NOTES, "#1f77b4", 2.0, 1.0, None)
    assert "drum" not in svg and len(rects(svg)) == 4
    assert max(y + h for y, h in rects(svg)) <= ROLL_HEIGHT + 1e-6


def test_drum_hits_are_diamonds_on_a_lane_below_the_notes():
    svg = piano_roll_svg(MOTIF, NOTES, "#1f77b4", 2.0, 1.0, (MOTIF_HITS, HITS))
    assert svg.count('class="drum"') == len(MOTIF_HITS) + len(HITS)
    assert 'class="drum-lane"' in svg and ">drums</text>" in svg
    lane = ROLL_HEIGHT - DRUM_LANE
    assert len(rects(svg)) == 4 and all(y + h <= lane + 1e-6 for y, h in rects(svg))  # the notes above it
    for points in re.findall(r'<polygon class="drum" points="([^"]+)"', svg):
        ys = [float(p.split(",")[1]) for p in points.split()]
        assert all(lane <= y <= ROLL_HEIGHT for y in ys) and len(ys) == 4
    # the motif's hits in grey, the continuation's in its colour, as the notes
    fills = re.findall(r'<polygon class="drum" [^>]*fill="([^"]+)"', svg)
    assert fills == ["#999"] * len(MOTIF_HITS) + ["#1f77b4"] * len(HITS)


def test_the_continuation_page_draws_each_lines_own_hits():
    report = {"motif_seconds": 2.0, "seconds": 1.0}
    example = {
        "motif": MOTIF,
        "drums": {"motif": MOTIF_HITS, "truth": HITS, "continuations": {"model": HITS[:1]}},
    }
    line = _continuation_line(report)
    _, truth, _ = line(example, "truth", NOTES, "#111")
    _, model, _ = line(example, "model", NOTES, "#1f77b4")
    _, none, _ = line(example, "n-gram", NOTES, "#ff7f0e")  # a system without hits: the motif's alone
    assert [s.count('class="drum"') for s in (truth, model, none)] == [5, 4, 3]
    _, piano, _ = line({"motif": MOTIF}, "model", NOTES, "#1f77b4")
    assert piano == piano_roll_svg(MOTIF, NOTES, "#1f77b4", 2.0, 1.0)


def test_the_picture_draws_hits_on_a_lane_and_the_page_of_examples_renders(tmp_path):
    ax = Figure().subplots()
    _drum_lane(ax, HITS, "C0", 40.0)
    (points,) = ax.collections
    assert [tuple(p) for p in points.get_offsets()] == [(0.0, 40.0), (0.25, 40.0)]
    example = {
        "file": "band.mid",
        "system": "model",
        "motif": MOTIF,
        "truth": NOTES,
        "continuation": NOTES,
        "drums": {"motif": MOTIF_HITS, "truth": HITS, "continuation": HITS, "continuations": {}},
    }
    report = {"motif_seconds": 2.0, "seconds": 1.0, "examples": [example]}
    assert plot_pianorolls(report, tmp_path / "rolls.png").stat().st_size > 0


def test_examples_carry_the_hits_of_the_motif_the_truth_and_each_system():
    N = pretty_midi.Note
    piece = SimpleNamespace(
        motif_parts={DRUMS: [N(90, 36, -1.0, -0.9)], 33: [N(80, 40, -1.0, -0.5)]},
        reference_parts={DRUMS: [N(90, 38, 0.5, 0.6)]},
    )
    parts = {"model": [[{DRUMS: [N(70, 42, 0.25, 0.3)]}]], "n-gram": [[]], "repeat-motif": [[{33: []}]]}
    drums = _example_drums(piece, parts, "model", 0)["drums"]
    assert drums["motif"] == [[36, -1.0, -0.9, 90]] and drums["truth"] == [[38, 0.5, 0.6, 90]]
    assert drums["continuation"] == [[42, 0.25, 0.3, 70]]
    assert drums["continuations"] == {"model": [[42, 0.25, 0.3, 70]], "n-gram": [], "repeat-motif": []}
    assert _example_drums(SimpleNamespace(motif_parts=None), parts, "model", 0) == {}  # a piano report
