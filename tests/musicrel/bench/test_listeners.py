"""`musicrel bench listeners`: the real-time criterion on made-up arrival times, and the bench itself against
a real uvicorn serving the tiny checkpoint (N = 1 and 3, a second of music each)."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from musicrel.bench import listeners
from musicrel.bench.listener_clients import Stream
from musicrel.bench.listener_service import _gpu_bytes
from musicrel.bench.listeners import COLUMNS, LEAD_S, SLIP_MARGIN_S, holds, lateness, on_time
from musicrel.errors import ConfigError

MUSIC = [0.0, 0.0, 0.25, 0.5, 0.5, 0.75, 1.5, 2.0]  # note_on times: chords (two notes at once) included


def test_a_stream_ahead_of_the_music_is_on_time():
    # Generated at twice real time, the chord's second note one step (25 ms) after the first.
    arrivals = [10.0 + t / 2 + 0.025 * (i in (1, 4)) for i, t in enumerate(MUSIC)]
    assert lateness(arrivals, MUSIC) == pytest.approx(0.025)
    assert on_time(arrivals, MUSIC)


def test_a_stream_at_exactly_real_time_is_on_time_and_one_note_late_is_not():
    arrivals = [5.0 + t for t in MUSIC]
    assert lateness(arrivals, MUSIC) == pytest.approx(0.0)
    assert on_time(arrivals, MUSIC)
    late = list(arrivals)
    late[5] += 0.2  # the note at 0.75 s arrives 0.2 s after its place: the page would slip
    assert lateness(late, MUSIC) == pytest.approx(0.2)
    assert not on_time(late, MUSIC)


def test_the_lead_is_the_tolerance():
    arrivals = [5.0 + t for t in MUSIC]
    arrivals[-1] += LEAD_S - SLIP_MARGIN_S - 0.001  # just inside what the page's lead absorbs
    assert on_time(arrivals, MUSIC)
    arrivals[-1] += 0.002  # just past it
    assert not on_time(arrivals, MUSIC)
    assert on_time(arrivals, MUSIC, lead_s=0.5)  # a player that waits longer before the first note


def test_a_silent_stream_is_not_on_time():
    assert lateness([], []) == -math.inf
    assert not on_time([], [])


def test_a_late_first_note_is_latency_not_lateness():
    # The timeline starts when the first note arrives: a stream that starts late and keeps pace is on time.
    arrivals = [100.0 + t for t in MUSIC]
    assert on_time(arrivals, MUSIC)


def test_stream_reads_the_ndjson_lines():
    s = Stream(sent=1.0)
    s.take(b'{"type":"start","seed":3,"samples":1}', 1.1)
    s.take(b'{"type":"note_on","sample":0,"id":0,"pitch":60,"velocity":80,"time":0.5}', 1.5)
    s.take(b'{"type":"note_on","sample":0,"id":1,"pitch":64,"velocity":80,"time":12.125}', 1.5)
    s.take(b'{"type":"note_off","sample":0,"id":0,"time":0.7}', 1.6)
    s.take(b'{"type":"result","new_tokens":42,"timings":{"decode_ms":100.0},"first_note_ms":3}', 2.0)
    assert (s.arrivals, s.times) == ([1.5, 1.5], [0.5, 12.125])
    assert s.first_note_s == pytest.approx(0.5)
    assert (s.done, s.new_tokens, s.decode_ms, s.finished) == (2.0, 42, 100.0, True)
    e = Stream()
    e.take(b'{"type":"error","status":504,"error":{"code":"timeout","message":"late"}}', 3.0)
    assert (e.error, e.finished) == ("timeout", False)


def test_listener_counts_and_holds():
    assert listeners.listener_counts(None, "cuda") == [1, 64, 256, 1024]
    assert listeners.listener_counts(None, "cpu") == [1, 4, 8]
    assert listeners.listener_counts("2, 5", "cpu") == [2, 5]
    for bad in ("0", "a,b", ""):
        with pytest.raises(ConfigError):
            listeners.listener_counts(bad, "cpu")
    rows = [{"listeners": 1, "on_time_share": 1.0}, {"listeners": 64, "on_time_share": 0.995},
            {"listeners": 256, "on_time_share": 0.5}]  # fmt: skip
    assert holds(rows, 0.99) == 64
    assert holds(rows, 1.0) == 1
    assert holds(rows[2:], 0.99) is None


@pytest.mark.long(20)
def test_bench_listeners_on_the_cpu(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "listeners.json"
    parser = argparse.ArgumentParser()
    listeners.add_arguments(parser)
    argv = ["--checkpoint", str(tiny_checkpoint), "--device", "cpu", "--listeners", "1,3", "--seconds", "1"]
    args = parser.parse_args([*argv, "--client-processes", "2", "--out", str(out)])
    assert listeners.run(args) == 0
    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("N "))
    assert all(name in header for name, _, _ in COLUMNS)
    report = json.loads(out.read_text())
    assert [r["listeners"] for r in report["rows"]] == [1, 3]
    assert report["device"] == "cpu" and report["motifs"]  # the bundled examples
    assert report["client_processes"] == 2  # N=1 from this process, N=3 from two (2 + 1 streams)
    for row in report["rows"]:
        assert all(key in row for _, key, _ in COLUMNS)
        assert row["finished"] == row["listeners"] and row["errors"] == {}
        assert 0.0 <= row["on_time_share"] <= 1.0 and 0.0 <= row["dense_share"] <= 1.0
        assert 0 < row["first_note_p50_ms"] <= row["first_note_p99_ms"]
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0 and row["stream_tokens_per_s_median"] > 0
        assert row["memory_kind"] == "rss" and row["memory_idle_mib"] > 0
        assert row["memory_peak_mib"] >= row["memory_idle_mib"] and row["memory_per_stream_mib"] >= 0
    assert report["holds"] in (None, 1, 3)


def test_gpu_memory_of_the_service_processes_from_nvidia_smi(tmp_path, monkeypatch):
    # nvidia-smi's own output format (csv, noheader, nounits), from a stand-in on PATH: the parsing is tested
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --query-compute-apps=*) printf "101, 1500\\n102, 500\\n999, 7000\\n" ;;\n'
        '  --query-gpu=*) printf "9000\\n" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    mib = 1024 * 1024
    assert _gpu_bytes([101, 102]) == 2000 * mib  # the service's two processes, not pid 999
    assert _gpu_bytes([5]) == 9000 * mib  # none of them named: the GPU's used memory
