"""`musicrel pack-gpu`: what a training run on a bare GPU machine needs, in one folder that travels with the
checkout: a device command carries 64 MiB in all, the checkout's own files (the shipped checkpoints above all)
included, so the pack gets what they leave (`carried_bytes`).

Layout of OUT (git-ignored, carried to the GPU machine with the working tree):
    data/        manifest.json + train/val/test .npy and _offsets.npy of a prepared folder (not its cache/),
                 each array xz-compressed (`.npy.xz`: a token stream shrinks about 3x); run.sh unpacks them
    wheels/      the packages musicrel's training needs that the GPU machine lacks, at the versions installed
                 here, plus musicrel itself (all pure Python)
    run.sh       start | status | wait | collect | train: install the wheels, unpack, `musicrel train` with
                 configs/gpu.yaml + a size in the background, export the best checkpoint so far
    README.md    the commands, and what is in the pack
    pack.json    the same as data: files, sizes, versions, the git commit packed

The GPU machine has no network; what it lacks is worked out from the installed packages' metadata: the
closure of musicrel's requirements (without the server's) minus the closure of what the machine has.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from musicrel.data.prepared import MANIFEST, SPLITS
from musicrel.errors import ConfigError, MusicrelError

# What one device command may carry along: the checkout's files and the pack together.
PACK_LIMIT_BYTES = 64 * 2**20
REPO = Path(__file__).resolve().parents[1]
# Wheel members training never reads, left out of the pack's copy of the wheel: pretty_midi's General MIDI
# soundfont (fluidsynth's, for synthesising audio) is 5.7 of its wheel's 5.6 MiB (it barely compresses).
WHEEL_DROPS = {"pretty_midi": ("pretty_midi/TimGM6mb.sf2",)}
# The GPU machine's Python (KINDS.md: the 'cuda' image); pip installed each one's own requirements with it.
# matplotlib too (the image has it; lightning's torchmetrics imports it when present): its wheels and their
# image and font packages would take 24 MiB of the 64 that the data needs.
# protobuf (tensorboardX's) is in the image too, a 1.5 MiB binary wheel.
GPU_HAS = ("torch", "lightning", "safetensors", "numpy", "triton", "matplotlib", "protobuf")
GPU_PYTHON = "3.12"
GPU_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# musicrel's requirements that only `musicrel serve` imports.
SERVER_ONLY = (
    "fastapi",
    "fastapi-offline",
    "uvicorn",
    "python-multipart",
    "pydantic-settings",
    "prometheus-client",
)
# musicrel's training requirements that only `musicrel prepare` imports (datasketch, for the composition
# groups, brings scipy: 34 MiB; evaluate-continuations needs it too, on a plain folder only, not on the GPU).
PREPARE_ONLY = ("datasketch",)
ARRAYS = tuple(f"{s}{suffix}.npy" for s in SPLITS for suffix in ("", "_offsets"))
DATA_FILES = (MANIFEST, *ARRAYS)
PACKED_DATA = (MANIFEST, *(f"{n}.xz" for n in ARRAYS))  # what data/ of a pack holds
# Markers are evaluated for the GPU machine, not for this one.
TARGET_ENV = {
    "python_version": GPU_PYTHON,
    "python_full_version": f"{GPU_PYTHON}.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
PACK_FILE = "pack.json"
SIZES = ("default", "2m", "8m", "20m")  # configs/gpu-<size>.yaml


class PackError(MusicrelError):
    code = "pack_failed"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_requires(name: str) -> list[str] | None:
    """Requirement strings of an installed distribution; None when it is not installed."""
    from importlib import metadata

    try:
        return metadata.requires(name) or []
    except metadata.PackageNotFoundError:
        return None


def closure(
    roots: Iterable[str],
    requires: Callable[[str], list[str] | None] = _installed_requires,
    stop: Iterable[str] = (),
    strict: bool = True,
) -> set[str]:
    """Normalized names of `roots` (requirement strings, extras honoured) and of everything they require on
    the GPU machine, not descending below `stop`. strict: a requirement not installed here is an error."""
    from packaging.requirements import Requirement

    def wanted(req: Requirement, extra: str) -> bool:
        return req.marker is None or req.marker.evaluate({**TARGET_ENV, "extra": extra})

    stop = {normalize(s) for s in stop}
    todo = [req for req in map(Requirement, roots) if wanted(req, "")]
    seen: set[str] = set()
    expanded: set[tuple[str, str]] = set()  # (name, extra) whose requirements are in todo already
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        seen.add(name)
        if name in stop:
            continue
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in expanded:
                continue
            expanded.add((name, extra))
            reqs = requires(req.name)
            if reqs is None:
                if strict:
                    raise PackError(
                        f"{req.name} (needed by musicrel's training) is not installed here, so the version "
                        f"of its wheel is unknown: pip install '{req}'",
                        code="not_installed",
                    )
                break
            todo += [sub for sub in map(Requirement, reqs) if wanted(sub, extra)]
    return seen


def training_requirements(requires: Callable[[str], list[str] | None] = _installed_requires) -> list[str]:
    """musicrel's own requirements for training (pyproject's dependencies and its `train` extra, read from the
    installed metadata), without the other extras and without those only the server or `prepare` import."""
    from packaging.requirements import Requirement

    reqs = requires("musicrel")
    if reqs is None:
        raise PackError(
            "musicrel is not installed in this environment (pip install -e .)", code="not_installed"
        )
    not_training = {normalize(n) for n in (*SERVER_ONLY, *PREPARE_ONLY)}
    out = []
    for r in reqs:
        req = Requirement(r)
        if req.marker is not None and "extra" in str(req.marker):
            if not req.marker.evaluate({"extra": "train"}):
                continue
            req.marker = None  # wanted on the GPU machine as a plain requirement
            r = str(req)
        if normalize(req.name) not in not_training:
            out.append(r)
    return out


def missing_on_gpu(requires: Callable[[str], list[str] | None] = _installed_requires) -> list[str]:
    """Sorted normalized names of the distributions musicrel's training needs that the GPU machine lacks."""
    need = closure(training_requirements(requires), requires, stop=GPU_HAS)
    has = closure(GPU_HAS, requires, strict=False)
    return sorted(need - has)


def wheel_specs(names: Iterable[str]) -> list[str]:
    """NAME==VERSION of each, at the version installed here (the pack is what this environment tested)."""
    from importlib import metadata

    return [f"{n}=={metadata.version(n)}" for n in names]


def pip_download(specs: list[str], dest: Path) -> None:
    """Wheels for the GPU machine's Python and platform (binary only: nothing is built there)."""
    platforms = [a for p in GPU_PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version"]
    cmd += [GPU_PYTHON, "--implementation", "cp", *platforms, "-q", "-d", str(dest), *specs]
    _run(cmd, "pip download")


def build_musicrel_wheel(dest: Path) -> None:
    """musicrel's own wheel, built from a clean copy of the source (setuptools' build/ keeps stale files)."""
    src = Path(__file__).resolve().parents[1]
    if not (src / "pyproject.toml").is_file():
        raise PackError(f"no pyproject.toml in {src}: the musicrel wheel is built from a source checkout")
    with tempfile.TemporaryDirectory(prefix="musicrel-src-") as tmp:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(src / name, tmp)
        for pkg in ("musicrel", "server", "training"):
            shutil.copytree(src / pkg, Path(tmp) / pkg, ignore=ignore)
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        _run([*cmd, "-w", str(dest), tmp], "pip wheel")


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [x for x in (proc.stderr or proc.stdout).splitlines() if x.strip()]
        raise PackError(f"{what} failed: {lines[-1] if lines else f'exit status {proc.returncode}'}")


def download_wheels(dest: Path) -> None:
    """The wheels of `missing_on_gpu()` and of musicrel into `dest`."""
    pip_download(wheel_specs(missing_on_gpu()), dest)
    build_musicrel_wheel(dest)


def slim_wheel(path: Path, drop: Iterable[str]) -> None:
    """Rewrite the wheel at `path` without the members `drop` and their rows in its RECORD (pip installs it as
    before, less those files)."""
    drop = set(drop)
    buf = io.BytesIO()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename in drop:
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(r for r in rows if r.split(",", 1)[0] not in drop).encode()
            dst.writestr(item, data)
    path.write_bytes(buf.getvalue())


def slim_wheels(wheel_dir: Path) -> None:
    for wheel in wheel_dir.glob("*.whl"):
        drop = WHEEL_DROPS.get(normalize(wheel.name.split("-", 1)[0]).replace("-", "_"))
        if drop:
            slim_wheel(wheel, drop)


def carried_bytes(root: Path = REPO) -> int:
    """What a device command carries from the checkout besides the pack: its tracked files and the untracked
    ones git does not ignore (0 outside a git checkout)."""
    try:
        proc = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            cwd=root,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    if proc.returncode != 0:
        return 0
    paths = (root / p for p in proc.stdout.decode(errors="replace").split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file())


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def pack_gpu(
    data_dir,
    out,
    wheels: bool = True,
    limit_bytes: int | None = None,
    downloader: Callable[[Path], None] = download_wheels,
) -> dict:
    """Write the pack (see the module docstring) and return pack.json's content. Refuses, writing nothing,
    when the data is not a prepared folder or the whole would exceed `limit_bytes` (None: PACK_LIMIT_BYTES
    less `carried_bytes()`, what the checkout leaves of a device command)."""
    from musicrel.data.prepared import load_manifest

    carried = carried_bytes() if limit_bytes is None else 0
    limit = limit_bytes if limit_bytes is not None else PACK_LIMIT_BYTES - carried
    beside = f" ({_mib(PACK_LIMIT_BYTES)} less the checkout's {_mib(carried)})" if carried else ""

    data_dir, out = Path(data_dir), Path(out)
    manifest = load_manifest(data_dir)
    missing = [n for n in DATA_FILES if not (data_dir / n).is_file()]
    if missing:
        raise ConfigError(
            f"{data_dir} lacks {', '.join(missing)}; run `musicrel prepare`", code="not_prepared"
        )
    if out.exists() and any(out.iterdir()) and not (out / PACK_FILE).is_file():
        raise PackError(f"{out} exists and is not a pack (no {PACK_FILE}): choose another --out")
    with tempfile.TemporaryDirectory(prefix="musicrel-pack-") as tmp:
        data_tmp, wheel_dir = Path(tmp) / "data", Path(tmp) / "wheels"
        data_tmp.mkdir()
        wheel_dir.mkdir()
        shutil.copy2(data_dir / MANIFEST, data_tmp / MANIFEST)
        for n in ARRAYS:
            compress(data_dir / n, data_tmp / f"{n}.xz")
        sizes = {f"data/{n}": (data_tmp / n).stat().st_size for n in PACKED_DATA}
        _check_size(out, sizes, limit, beside)  # before any download
        if wheels:
            downloader(wheel_dir)
            slim_wheels(wheel_dir)
        found = sorted(wheel_dir.glob("*.whl"))
        sizes.update({f"wheels/{w.name}": w.stat().st_size for w in found})
        info = {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "git_commit": _git_commit(),
            "data": {
                "source": str(data_dir.resolve()),
                "splits": {
                    s: manifest["splits"][s]["stream_tokens"] for s in SPLITS if s in manifest["splits"]
                },
                "unpacked_bytes": sum((data_dir / n).stat().st_size for n in DATA_FILES),
            },
            "wheels": [w.name for w in found],
            "gpu_python": GPU_PYTHON,
            "limit_bytes": limit,
            "checkout_bytes": carried,
        }
        texts = {"run.sh": RUN_SH, "README.md": readme(info, out)}
        sizes.update({n: len(t.encode()) for n, t in texts.items()})
        sizes[PACK_FILE] = 4096  # written last, with the total; a generous bound
        info["files"] = {n: s for n, s in sizes.items() if n != PACK_FILE}
        info["total_bytes"] = sum(sizes.values())
        _check_size(out, sizes, limit, beside)

        out.mkdir(parents=True, exist_ok=True)
        for sub in ("data", "wheels"):
            shutil.rmtree(out / sub, ignore_errors=True)
            shutil.move(Path(tmp) / sub, out / sub)
    for n, t in texts.items():
        (out / n).write_text(t)
    os.chmod(out / "run.sh", 0o755)
    (out / PACK_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def compress(src: Path, dest: Path) -> None:
    """xz (LZMA) of one file: a uint16 token stream shrinks about 3x, gzip's about 2x. run.sh unpacks it
    with Python's lzma, which every CPython has."""
    with open(src, "rb") as f, lzma.open(dest, "wb", preset=6) as z:
        shutil.copyfileobj(f, z, length=2**22)


def _check_size(out: Path, sizes: dict[str, int], limit: int, beside: str = "") -> None:
    total = sum(sizes.values())
    if total > limit:
        largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        what = ", ".join(f"{n} {_mib(s)}" for n, s in largest)
        raise PackError(
            f"{out} would hold {_mib(total)}, over the {_mib(limit)} limit{beside}; largest: {what}",
            code="pack_too_large",
        )


def _git_commit() -> str | None:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() or None


def readme(info: dict, out: Path) -> str:
    pack = out.as_posix()
    wheels = "\n".join(f"- {w}" for w in info["wheels"]) or "- none (packed with --no-wheels)"
    splits = ", ".join(f"{s} {n:,} tokens" for s, n in info["data"]["splits"].items())
    return f"""# musicrel GPU pack

Written by `musicrel pack-gpu` on {info["created"]} (commit {info["git_commit"] or "unknown"}).

On the GPU machine, from the repository root (the pack travels with the working tree). A device command
lasts at most 10 minutes and the machine about 30, so the run goes on in the background between commands:

```bash
bash {pack}/run.sh start 8m         # SIZE: {", ".join(SIZES)} (configs/gpu-SIZE.yaml); [SEQ_LEN]
bash {pack}/run.sh wait 540; bash {pack}/run.sh collect   # each later command: the best so far to $OUT
bash {pack}/run.sh status           # running or ended, the log's tail
bash {pack}/run.sh train 8m -- --trainer.max_time 00:00:08:00   # all in one command; after --: overrides
```

1. `start` installs the wheels the machine lacks (those it has are kept):
   `python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site WHEELS`,
   unpacks `data/*.npy.xz`, and starts in a session of its own
   `python3 -m musicrel.cli train --config configs/gpu.yaml --config configs/gpu-SIZE.yaml
   --data.data_dir {pack}/data --trainer.default_root_dir /tmp/musicrel-runs --run_name gpu-SIZE[-LEN]
   --model.config.max_seq_len LEN` (bf16 mixed precision, the model compiled, stopped by trainer.max_time),
   logging to /tmp/musicrel-runs/gpu-SIZE[-LEN].log;
2. `wait [SECONDS]` returns when the run ends or SECONDS have passed (a status line every minute), and fails
   when the run ended without finishing;
3. `collect` runs `python3 -m musicrel.cli export <best-*.ckpt, else last.ckpt> --out $OUT/gpu-SIZE[-LEN]
   --dtype bfloat16 --max-shard-mib 16` and copies the run's metrics.csv and log beside it: while the run
   goes on too, so a machine taken back early still leaves the best so far.

$OUT/gpu-SIZE[-LEN]/ then holds at most 8 files of at most 16 MiB each (bfloat16 weights in shards, the
index, config.json, MODEL_CARD.md, metrics.csv, train.log): what a device command brings back. Here,
`load_model(folder)` reads it on a CPU (float32). Environment: PYTHON (python3), SITE (/tmp/site),
RUNS (/tmp/musicrel-runs), OUT (gpu_out where unset), MAX_SHARD_MIB (16), WEIGHTS_DTYPE (bfloat16).

Data: {splits}.

Wheels (python {info["gpu_python"]}, manylinux x86_64):
{wheels}
"""


# The script is fixed text: every setting it passes lives in configs/gpu*.yaml or in the variables below.
RUN_SH = r"""#!/usr/bin/env bash
# Written by `musicrel pack-gpu`. Train and export one model on a GPU machine, from the repository root:
#   bash PACK/run.sh start SIZE [SEQ_LEN] [-- MORE TRAIN OVERRIDES]   install, unpack, train in the background
#   bash PACK/run.sh status                                            running or ended, the log's tail
#   bash PACK/run.sh wait [SECONDS]                                    until the run ends or SECONDS pass
#   bash PACK/run.sh collect                                           export the best checkpoint so far
#   bash PACK/run.sh train SIZE [SEQ_LEN] [-- ...]                     start, wait, collect in one command
# A device command lasts at most 10 minutes and the machine about 30: start in one command, then wait and
# collect in the next ones; collect works while the run goes on (README.md beside this file says more).
set -euo pipefail
PACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
usage="usage: run.sh start|train SIZE [SEQ_LEN] [-- overrides] | status | wait [SECONDS] | collect
SIZE: default, 2m, 8m or 20m (configs/gpu-SIZE.yaml)"
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
RUNS=${RUNS:-/tmp/musicrel-runs}
DEST=${OUT:-gpu_out}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
CURRENT=$RUNS/current # the run under way: its name, its pid, when it started

die() { echo "run.sh: $*" >&2; exit 2; }
run_name() { [[ -f $CURRENT ]] || die "no run started (run.sh start SIZE)"; sed -n 1p "$CURRENT"; }
running() { [[ -f $CURRENT ]] && kill -0 "$(sed -n 2p "$CURRENT")" 2>/dev/null; }

install() {
  # Wheels of what this machine lacks. One it already has stays: its other packages were built against it.
  local wheels
  mapfile -t wheels < <("$PYTHON" -c '
import importlib.metadata as md, pathlib, sys
for w in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    try:
        md.version(w.name.split("-")[0])
    except md.PackageNotFoundError:
        print(w)
' "$PACK/wheels")
  if [[ ${#wheels[@]} -gt 0 ]]; then
    echo "installing into $SITE: ${wheels[*]##*/}"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${wheels[@]}"
  fi
}

unpack() {
  # data/*.npy.xz -> data/*.npy, once; a half-written array never lies under its final name.
  "$PYTHON" -c '
import lzma, os, pathlib, shutil, sys
for xz in sorted(pathlib.Path(sys.argv[1]).glob("*.npy.xz")):
    dest = xz.with_suffix("")
    if not dest.exists():
        with lzma.open(xz) as src, open(f"{dest}.part", "wb") as out:
            shutil.copyfileobj(src, out, length=2**22)
        os.replace(f"{dest}.part", dest)
' "$PACK/data"
}

start() {
  local size=${1:-}
  [[ -n $size ]] || die "$usage"
  shift
  local seq_len=""
  if [[ $# -gt 0 && $1 != -- ]]; then seq_len=$1; shift; fi
  if [[ $# -gt 0 && $1 == -- ]]; then shift; fi
  [[ -f configs/gpu.yaml && -f configs/gpu-$size.yaml ]] || die "run from the repository root; $usage"
  if running; then die "a run is under way: $(run_name) (run.sh status)"; fi
  install
  unpack
  local run=gpu-$size ctx=()
  if [[ -n $seq_len ]]; then run=$run-$seq_len; ctx=(--model.config.max_seq_len "$seq_len"); fi
  mkdir -p "$RUNS"
  # A session of its own: the run outlives the device command that started it. The repository's own code
  # comes first on sys.path (python -m from its root).
  setsid "$PYTHON" -m musicrel.cli train --config configs/gpu.yaml --config "configs/gpu-$size.yaml" \
    --data.data_dir "$PACK/data" --trainer.default_root_dir "$RUNS" --run_name "$run" "${ctx[@]}" "$@" \
    >"$RUNS/$run.log" 2>&1 </dev/null &
  printf '%s\n%s\n%s\n' "$run" "$!" "$(date +%s)" >"$CURRENT"
  echo "started $run (pid $!); log: $RUNS/$run.log"
}

status() {
  local run took
  run=$(run_name)
  took=$(( $(date +%s) - $(sed -n 3p "$CURRENT") ))
  if running; then echo "$run: running, ${took} s"; else echo "$run: ended (${took} s since its start)"; fi
  tail -n "${1:-6}" "$RUNS/$run.log"
}

wait_run() {
  local limit=${1:-0} begun=$SECONDS last=$SECONDS
  run_name >/dev/null
  while running; do
    if (( limit > 0 && SECONDS - begun >= limit )); then break; fi
    sleep 2
    if (( SECONDS - last >= 60 )); then status 2; last=$SECONDS; fi
  done
  status
  if ! running && ! grep -q "^done at step" "$RUNS/$(run_name).log"; then
    die "the run failed (its log above)"
  fi
}

collect() {
  # The best checkpoint (by val_nll), else the last, as a folder that comes back whole: bfloat16 weights in
  # shards of at most 16 MiB (a device command returns 8 files of <= 16 MiB). While the run goes on, a
  # checkpoint can be replaced under us: it is copied first, and tried again.
  local run version tmp attempt ckpt
  run=$(run_name)
  version=$(ls -d "$RUNS/$run"/version_* | sort -V | tail -n 1)
  tmp=$(mktemp -d)
  shopt -s nullglob
  for attempt in 1 2 3; do
    local best=("$version"/checkpoints/best-*.ckpt)
    ckpt=${best[0]:-$version/checkpoints/last.ckpt}
    if [[ -f $ckpt ]] && cp "$ckpt" "$tmp/" && "$PYTHON" -m musicrel.cli export "$tmp/${ckpt##*/}" \
        --out "$DEST/$run" --dtype "${WEIGHTS_DTYPE:-bfloat16}" --max-shard-mib "${MAX_SHARD_MIB:-16}"; then
      cp "$version/metrics.csv" "$DEST/$run/metrics.csv"
      cp "$RUNS/$run.log" "$DEST/$run/train.log"
      rm -rf "$tmp"
      ls -l "$DEST/$run"
      return 0
    fi
    echo "collect: attempt $attempt found no readable checkpoint in $version/checkpoints" >&2
    rm -f "$tmp"/*
    sleep 5
  done
  rm -rf "$tmp"
  die "no checkpoint to collect yet in $version/checkpoints"
}

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  start) start "$@" ;;
  status) status ;;
  wait) wait_run "${1:-0}" ;;
  collect) collect ;;
  train) start "$@" && wait_run 0 && collect ;;
  *) die "$usage" ;;
esac
"""
