"""`musicrel bench listeners`: how many streaming listeners one service holds at real time (issue 43).

Per N (a list), a fresh `uvicorn server.app:app` (MUSICREL_DEVICE from --device, its batch N rows wide, its
queue and upload bounds above N) and N concurrent clients in this process (asyncio, one httpx.AsyncClient
with a connection per client; --client-processes splits them among processes), all sent at once (--ramp-s
spreads them), each POSTing a real motif to
/v1/continuations/stream for --seconds of music and reading the NDJSON as it comes. Per N, one row:

- on time: the share of streams that a listener hears without a gap, played as the page plays a stream
  (server/static/js/synth.js `liveOn`): the first note_on sounds LEAD_S after it arrives, every later one at
  its distance in music time from the first; a note that arrives later than LEAD_S - SLIP_MARGIN_S before
  its place slips the timeline. A stream is on time when no note_on slips, i.e. when for every note_on i
  (arrival a_i on this client's clock, music time m_i; 0 the first)
      (a_i - a_0) - (m_i - m_0) <= LEAD_S - SLIP_MARGIN_S,
  and it ended with its result (no error, no HTTP refusal, within the phase's time limit) with a note in it.
- dense: the share of streams that decoded at least 40 events a second (EVENTS_PER_SECOND_OF_MUSIC, a dense
  performance) while in the batch: the result's new_tokens / its timings.decode_ms. What the music itself
  needs is the "on time" column; this one says whether a dense performance would still have kept up.
- first note p50 / p99: from sending the request to the arrival of its first note_on line (upload, parse,
  queue, prefill, the tokens before the first note, HTTP).
- tokens/s: the new_tokens of every result (server side) over the phase's wall time (first send to last
  answer); per stream: the median of new_tokens / decode time.
- memory per stream: (peak during the phase - idle before it) / N, the idle and peak sampled every
  MEMORY_PERIOD_S from outside: on cuda the GPU memory nvidia-smi gives the server's processes (the engine's
  CUDA context and its caching allocator's reservation: at least torch.cuda.max_memory_allocated), on cpu
  the resident set of the server and its engine.
- holds: the largest N measured whose on-time share is at least --hold-share.

The client's event loop lag (a ticker's worst delay) is printed with each row: a loaded client would make
streams look late that were not.

Here: the criterion, the row and its table, the bench's options and its loop over N; the clients are
`listener_clients`, the service and its memory `listener_service`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path

from musicrel.bench.generate import EVENTS_PER_SECOND_OF_MUSIC
from musicrel.bench.listener_clients import Stream, run_phase
from musicrel.bench.listener_service import (
    MIB,
    REPO,
    MemorySampler,
    gpu_name,
    raise_open_files,
    service,
    service_env,
)
from musicrel.bench.timing import cpu_name
from musicrel.errors import ConfigError

EXAMPLES = REPO / "server" / "static" / "examples"
LEAD_S = 0.06  # server/static/js/modes/live.js LIVE_LEAD_S: the page plays the first note this late
SLIP_MARGIN_S = 0.005  # synth.js liveOn: a note starting sooner than this from now slips
DEFAULT_LISTENERS = {"cuda": (1, 64, 256, 1024), "cpu": (1, 4, 8)}


def register(bench_sub) -> None:
    p = bench_sub.add_parser(
        "listeners",
        help="N concurrent streaming listeners per N: on-time share, first-note p50/p99, tokens/s, memory",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", type=Path, default=Path("checkpoints/default"))
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="MUSICREL_DEVICE of the service")
    p.add_argument(
        "--listeners",
        default=None,
        help="comma list of N; None: 1,64,256,1024 on cuda, 1,4,8 on cpu",
    )
    p.add_argument("--seconds", type=float, default=10.0, help="music each stream asks for")
    p.add_argument(
        "--motif",
        type=Path,
        action="append",
        default=[],
        help="a MIDI file the clients upload in turn (repeatable); none: server/static/examples/*.mid",
    )
    p.add_argument("--ramp-s", type=float, default=0.0, help="spread the N sends over this many seconds")
    p.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="split the N clients among this many processes (when one process's event loop lags: the lag is "
        "printed per N)",
    )
    p.add_argument("--lead-s", type=float, default=LEAD_S, help="the player's lead before the first note")
    p.add_argument("--hold-share", type=float, default=0.99, help="on-time share that counts as held")
    p.add_argument(
        "--phase-timeout-s",
        type=float,
        default=None,
        help="give up on a phase's streams after this long; None: 3 x seconds + 60",
    )
    p.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")


# ---------------------------------------------------------------- the real-time criterion


def lateness(arrivals: list[float], times: list[float]) -> float:
    """The most any note_on arrived after its place on a timeline started at the first one's arrival:
    max over i of (a_i - a_0) - (m_i - m_0), 0 for the first note itself; -inf with no note."""
    if not arrivals:
        return -math.inf
    a0, m0 = arrivals[0], times[0]
    return max((a - a0) - (m - m0) for a, m in zip(arrivals, times, strict=True))


def on_time(arrivals: list[float], times: list[float], lead_s: float = LEAD_S) -> bool:
    """A player that starts the first note `lead_s` after it arrives plays every note_on in its place (none
    slips: see the module docstring). False with no note at all."""
    return bool(arrivals) and lateness(arrivals, times) <= lead_s - SLIP_MARGIN_S


# ---------------------------------------------------------------- summary


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile; nan with no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def summarize(n: int, streams: list[Stream], wall: float, lead_s: float) -> dict:
    """One row of the table (memory added by the caller)."""
    finished = [s for s in streams if s.finished]
    timely = [s for s in finished if on_time(s.arrivals, s.times, lead_s)]
    rates = [s.new_tokens / (s.decode_ms / 1000) for s in finished if s.decode_ms]
    firsts = [1000 * s.first_note_s for s in streams if s.first_note_s is not None]
    late = [lateness(s.arrivals, s.times) for s in finished if s.arrivals]
    errors: dict[str, int] = {}
    for s in streams:
        if not s.finished:
            errors[s.error or "no_result"] = errors.get(s.error or "no_result", 0) + 1
    return {
        "listeners": n,
        "finished": len(finished),
        "errors": errors,
        "silent": sum(1 for s in finished if not s.arrivals),
        "on_time_share": len(timely) / n,
        "dense_share": sum(r >= EVENTS_PER_SECOND_OF_MUSIC for r in rates) / n,
        "first_note_p50_ms": quantile(firsts, 0.5),
        "first_note_p99_ms": quantile(firsts, 0.99),
        "lateness_p99_s": quantile(late, 0.99),
        "tokens": sum(s.new_tokens for s in finished),
        "tokens_per_s": sum(s.new_tokens for s in finished) / wall if wall > 0 else math.nan,
        "stream_tokens_per_s_median": statistics.median(rates) if rates else math.nan,
        "wall_s": wall,
    }


def holds(rows: list[dict], share: float) -> int | None:
    """The largest N measured whose on-time share reaches `share`."""
    held = [r["listeners"] for r in rows if r["on_time_share"] >= share]
    return max(held) if held else None


COLUMNS = (
    ("N", "listeners", "{:d}"),
    ("on time", "on_time_share", "{:.1%}"),
    (">=40 ev/s", "dense_share", "{:.1%}"),
    ("first note p50 ms", "first_note_p50_ms", "{:.0f}"),
    ("p99 ms", "first_note_p99_ms", "{:.0f}"),
    ("tokens/s", "tokens_per_s", "{:,.0f}"),
    ("per stream tok/s", "stream_tokens_per_s_median", "{:,.0f}"),
    ("MiB per stream", "memory_per_stream_mib", "{:.2f}"),
    ("errors", "errors", "{}"),
)


def table(rows: list[dict]) -> list[str]:
    def cell(fmt: str, value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "n/a"
        if isinstance(value, dict):
            return ", ".join(f"{k} x{v}" for k, v in value.items()) or "0"
        return fmt.format(value)

    cells = [[cell(fmt, r.get(key)) for _, key, fmt in COLUMNS] for r in rows]
    header = [name for name, _, _ in COLUMNS]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    return [line, "-" * len(line)] + [
        " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells
    ]


# ---------------------------------------------------------------- the bench: a service and a phase per N


def phase_timeout_s(seconds: float) -> float:
    """The default limit of a phase's streams: three times their music, and a minute."""
    return 3 * seconds + 60


def listener_counts(text: str | None, device: str) -> list[int]:
    if text is None:
        return list(DEFAULT_LISTENERS[device])
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--listeners must be a comma list of whole numbers, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--listeners must be at least 1 each, got {text!r}")
    return counts


def load_motifs(paths: list[Path]) -> list[bytes]:
    files = paths or sorted(EXAMPLES.glob("*.mid"))
    if not files:
        raise ConfigError(f"no motif: give --motif FILE (none in {EXAMPLES})", code="no_motif")
    return [p.read_bytes() for p in files]


def measure_one(args: argparse.Namespace, n: int, uploads: list[bytes], timeout_s: float, none: Path) -> dict:
    """N's row: a fresh service, N streams, its memory sampled meanwhile."""
    env = service_env(args.checkpoint, args.device, n, args.seconds, timeout_s, none)
    with service(env, backlog=max(2048, 2 * n)) as (url, pid):
        memory = MemorySampler(pid, args.device)
        with memory:
            idle = memory.peak
            streams, wall, lags = run_phase(
                url, uploads, n, args.seconds, args.ramp_s, timeout_s, args.client_processes
            )
    row = summarize(n, streams, wall, args.lead_s)
    row.update(
        memory_kind=memory.kind,
        memory_idle_mib=idle / MIB,
        memory_peak_mib=memory.peak / MIB,
        memory_per_stream_mib=(memory.peak - idle) / MIB / n if memory.peak else math.nan,
        client_lag_max_ms=1000 * max(lags, default=0.0),
        client_lag_p99_ms=1000 * quantile(lags, 0.99),
    )
    return row


def measure(args: argparse.Namespace) -> dict:
    """Every N's row (a fresh service each) and what was measured with; written to --out after each N, so
    that a run cut off (the device check's time limit) keeps the rows it has. A service that fails (does not
    start, dies) fails its row, not the rows after it."""
    counts = listener_counts(args.listeners, args.device)
    if args.seconds <= 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    if not (args.checkpoint / "config.json").is_file():
        raise ConfigError(f"{args.checkpoint} holds no checkpoint (config.json)", code="no_checkpoint")
    uploads = load_motifs(args.motif)
    timeout_s = args.phase_timeout_s or phase_timeout_s(args.seconds)
    raise_open_files(max(counts))
    rows: list[dict] = []
    report = {
        "checkpoint": str(args.checkpoint),
        "device": args.device,
        "seconds": args.seconds,
        "motifs": [p.name for p in args.motif] or sorted(p.name for p in EXAMPLES.glob("*.mid")),
        "ramp_s": args.ramp_s,
        "client_processes": args.client_processes,
        "lead_s": args.lead_s,
        "hold_share": args.hold_share,
        "phase_timeout_s": timeout_s,
        "rows": rows,
        "holds": None,
        "gpu": gpu_name() if args.device == "cuda" else None,
        "cpu": cpu_name(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            try:
                row = measure_one(args, n, uploads, timeout_s, Path(tmp))
            except (RuntimeError, OSError) as exc:
                row = {"listeners": n, "failed": f"{type(exc).__name__}: {exc}", "errors": {"failed": n}}
                print(f"  N={n}: failed: {row['failed']}", flush=True)
            else:
                print(
                    f"  N={n}: {row['finished']} finished in {row['wall_s']:.1f} s, on time "
                    f"{row['on_time_share']:.1%}, client loop lag p99 {row['client_lag_p99_ms']:.0f} ms, "
                    f"max {row['client_lag_max_ms']:.0f} ms",
                    flush=True,
                )
            rows.append(row)
            report["holds"] = holds([r for r in rows if "failed" not in r], args.hold_share)
            if args.out is not None:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(_plain(report), indent=1, allow_nan=False) + "\n")
    return report


def run(args: argparse.Namespace) -> int:
    print(
        f"musicrel bench listeners: {args.checkpoint} on {args.device} ({cpu_name()}), {args.seconds:g} s "
        "of music per stream, a fresh service per N",
        flush=True,
    )
    report = measure(args)
    for line in table(report["rows"]):
        print(line)
    held = report["holds"]
    print(
        f"holds: {held if held is not None else 'none'} (the largest N measured with >= "
        f"{args.hold_share:.0%} of its streams on time)"
    )
    print(
        f"on time: no note_on later than a player that starts the first {1000 * args.lead_s:.0f} ms after "
        f"it arrives needs it; >=40 ev/s: new_tokens / decode time; memory: "
        f"({'GPU' if args.device == 'cuda' else 'RSS'} peak - idle) / N"
    )
    if args.out is not None:
        print(f"wrote {args.out}")
    return 0


def _plain(value):
    """`value` with every nan or infinite float as None: strict JSON."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
