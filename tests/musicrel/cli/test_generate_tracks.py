"""`musicrel generate` with a model whose codec has instruments: each output keeps the motif's tracks (a
band with drums, a quartet), summary.json lists them, --program is refused per motif
(program_with_instruments)."""

from __future__ import annotations

import json

import pretty_midi
import pytest
import torch

from musicrel.cli import main
from musicrel.model.checkpoint import save_model
from tests.musicrel.generation.test_continuation_tracks import CODEC, band, instruments_model, layout, quartet


@pytest.fixture
def setup(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model, shared machine
    save_model(instruments_model(), tmp_path / "ckpt", codec=CODEC)
    motifs = tmp_path / "motifs"
    motifs.mkdir()
    band().write(str(motifs / "band.mid"))
    quartet().write(str(motifs / "quartet.mid"))
    yield tmp_path, motifs
    torch.set_num_threads(threads)


def run(tmp_path, motifs, out, *extra) -> int:
    argv = ["generate", "--checkpoint", str(tmp_path / "ckpt"), "--input", str(motifs), "--out", str(out),
            "--num-samples", "1", "--seconds", "2", "--seed", "3", "--quiet", *extra]  # fmt: skip
    return main(argv)


def test_generate_keeps_the_tracks_and_lists_them(setup):
    tmp_path, motifs = setup
    out = tmp_path / "out"
    assert run(tmp_path, motifs, out, "--include-primer") == 0
    summary = json.loads((out / "summary.json").read_text())
    records = {r["input"].rsplit("/", 1)[-1]: r for r in summary["files"]}
    for name, make in (("band.mid", band), ("quartet.mid", quartet)):
        upload, record = make(), records[name]
        assert record["status"] == "ok"
        motif_tracks = [(t["name"], t["program"], t["drum"]) for t in record["primer"]["tracks"]]
        assert motif_tracks == layout(upload)
        pm = pretty_midi.PrettyMIDI(record["outputs"][0])
        assert layout(pm)[: len(upload.instruments)] == layout(upload)
        assert record["tracks"][0][: len(upload.instruments)] == record["primer"]["tracks"]


def test_generate_refuses_program_with_instruments(setup, capsys):
    tmp_path, motifs = setup
    assert run(tmp_path, motifs, tmp_path / "out", "--program", "40") == 2
    err = capsys.readouterr().err
    assert err.count("[program_with_instruments]") == 2
