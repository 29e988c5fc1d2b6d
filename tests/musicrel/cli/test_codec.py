"""`musicrel encode` / `musicrel decode` through `musicrel.cli.main`."""

from __future__ import annotations

import json

import pretty_midi
import pytest

from musicrel.cli import main
from tests.musicrel.conftest import far_tick_file, simple_file


@pytest.fixture
def song(tmp_path):
    path = tmp_path / "song.mid"
    path.write_bytes(simple_file(8))
    return path


def test_encode_decode_round_trip(song, tmp_path, capsys):
    tokens_path, out = tmp_path / "tokens.json", tmp_path / "out.mid"
    assert main(["encode", str(song), "--out", str(tokens_path), "--pedal", "events"]) == 0
    data = json.loads(tokens_path.read_text())
    assert data["codec"]["pedal"] == "events" and all(isinstance(t, int) for t in data["tokens"])
    assert main(["decode", str(tokens_path), "--out", str(out)]) == 0
    notes = pretty_midi.PrettyMIDI(str(out)).instruments[0].notes
    assert [n.pitch for n in notes] == [60 + i for i in range(8)]
    assert [round(n.start, 3) for n in notes] == [i * 0.5 for i in range(8)]


def test_encode_to_stdout_and_decode_bare_list(song, tmp_path, capsys):
    assert main(["encode", str(song), "--tracks", "0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["codec"]["tracks"] == [0]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data["tokens"]))
    out = tmp_path / "bare.mid"
    assert main(["decode", str(bare), "--out", str(out)]) == 0
    assert len(pretty_midi.PrettyMIDI(str(out)).instruments[0].notes) == 8


@pytest.mark.parametrize(
    "content,code",
    [(b"not midi at all", "not_midi"), (far_tick_file(), "too_long"), (simple_file(4)[:-9], "truncated")],
)
def test_encode_bad_file_is_one_line(tmp_path, capsys, content, code):
    bad = tmp_path / "bad.mid"
    bad.write_bytes(content)
    assert main(["encode", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and "Traceback" not in err and err.count("\n") == 1


def test_encode_shared_broken_file(broken_midi_files, capsys):
    for path in broken_midi_files:
        assert main(["encode", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("musicrel encode: error [") and err.count("\n") == 1


@pytest.mark.parametrize(
    "content,code",
    [
        ("{not json", "bad_tokens"),
        ('{"codec": {}}', "bad_tokens"),
        ('[1, "two"]', "bad_tokens"),
        ('{"codec": {"pedal": "sideways"}, "tokens": [1]}', "invalid_config"),
    ],
)
def test_decode_malformed_json_is_one_line(tmp_path, capsys, content, code):
    path = tmp_path / "t.json"
    path.write_text(content)
    assert main(["decode", str(path), "--out", str(tmp_path / "o.mid")]) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and err.count("\n") == 1


def test_missing_input_and_bad_track_index(song, capsys):
    assert main(["encode", "/nonexistent/x.mid"]) == 2
    assert "No such file" in capsys.readouterr().err
    assert main(["encode", str(song), "--tracks", "7"]) == 2
    assert "[no_such_track]" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["encode", "decode"])
def test_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "--out" in capsys.readouterr().out
