"""`musicrel pack-gpu` and the GPU training command: the pack holds the splits and stays under its limit, the
package list is what the GPU machine lacks, and the pack's run.sh -- the very command a GPU run uses --
trains, exports a sharded checkpoint and hands it to load_model, here on a CPU with a tiny model."""

from __future__ import annotations

import json
import lzma
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from musicrel.cli import main
from musicrel.errors import MusicrelError
from training.pack import (
    ARRAYS,
    MANIFEST,
    PACK_FILE,
    PACK_LIMIT_BYTES,
    PACKED_DATA,
    carried_bytes,
    closure,
    missing_on_gpu,
    normalize,
    pack_gpu,
    slim_wheels,
)

REPO = Path(__file__).resolve().parents[2]


def _never(dest):
    raise AssertionError("no download expected")


def test_pack_holds_the_splits_and_the_scripts(tiny_data, tmp_path, capsys):
    out = tmp_path / "pack"
    assert main(["pack-gpu", "--data", str(tiny_data), "--out", str(out), "--no-wheels"]) == 0
    info = json.loads((out / PACK_FILE).read_text())
    # the pack gets what the checkout's own files leave of a device command's 64 MiB
    assert info["limit_bytes"] + info["checkout_bytes"] == PACK_LIMIT_BYTES
    said = f"MiB of {info['limit_bytes'] / 2**20:.1f}"
    assert said in capsys.readouterr().out
    assert (tiny_data / "cache").is_dir() and not (out / "data" / "cache").exists()
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted(PACKED_DATA)
    assert (out / "data" / MANIFEST).read_bytes() == (tiny_data / MANIFEST).read_bytes()
    for name in ARRAYS:  # xz-compressed, and exactly the arrays once unpacked
        assert lzma.decompress((out / "data" / f"{name}.xz").read_bytes()) == (tiny_data / name).read_bytes()
    assert os.access(out / "run.sh", os.X_OK) and list((out / "wheels").iterdir()) == []
    on_disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    assert on_disk <= info["total_bytes"] <= on_disk + 4096  # pack.json is counted at an upper bound
    readme = (out / "README.md").read_text()
    assert f"bash {out.as_posix()}/run.sh start 8m" in readme and "--target /tmp/site" in readme
    # packing again replaces what is there, wheels included
    (out / "wheels" / "stale-1.0-py3-none-any.whl").write_bytes(b"x")
    pack_gpu(tiny_data, out, wheels=False, downloader=_never)
    assert list((out / "wheels").iterdir()) == []


def test_pack_refuses_what_would_not_travel(tiny_data, tmp_path, capsys):
    def big_wheel(dest: Path) -> None:
        (dest / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * (3 * 2**20))

    out = tmp_path / "pack"
    with pytest.raises(MusicrelError, match=r"over the 2\.0 MiB limit; largest: wheels/big-1\.0") as exc:
        pack_gpu(tiny_data, out, limit_bytes=2 * 2**20, downloader=big_wheel)
    assert exc.value.code == "pack_too_large" and not out.exists()
    # data alone over the limit: refused before anything is downloaded
    args = ["pack-gpu", "--data", str(tiny_data), "--out", str(out), "--max-mib", "0.001"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("training.pack.download_wheels", _never)
        assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[pack_too_large]" in err[0] and "data/" in err[0]

    with pytest.raises(MusicrelError, match="not a prepared data folder") as exc:
        pack_gpu(tmp_path, out, wheels=False)
    assert exc.value.code == "not_prepared"
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(MusicrelError, match="not a pack"):
        pack_gpu(tiny_data, tmp_path / "mine", wheels=False)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_the_checkout_travels_beside_the_pack_and_counts_against_its_limit(tiny_data, tmp_path, monkeypatch):
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [REPO / p for p in listed.decode().split("\0") if p]
    tracked = sum(p.stat().st_size for p in paths if p.is_file())
    shipped = sum(p.stat().st_size for p in (REPO / "checkpoints").rglob("*") if p.is_file())
    assert carried_bytes() >= tracked >= shipped > 0  # untracked files git does not ignore travel too
    # a checkout that leaves less than the data needs: refused, saying why, before any download
    monkeypatch.setattr("training.pack.carried_bytes", lambda: PACK_LIMIT_BYTES - 1024)
    why = r"over the 0\.0 MiB limit \(64\.0 MiB less the checkout's 64\.0 MiB\)"
    with pytest.raises(MusicrelError, match=why):
        pack_gpu(tiny_data, tmp_path / "pack", downloader=_never)
    assert not (tmp_path / "pack").exists()


def test_wheels_lose_what_training_never_reads(tmp_path):
    """pretty_midi's soundfont (5.7 MiB, for synthesis) stays out of the pack's copy; pip installs it."""
    wheel = tmp_path / "wheels" / "pretty_midi-0.2.11-py3-none-any.whl"
    wheel.parent.mkdir()
    files = {"pretty_midi/__init__.py": b"VALUE = 7\n", "pretty_midi/TimGM6mb.sf2": b"\0" * 4096}
    info = "pretty_midi-0.2.11.dist-info"
    meta = {
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: pretty_midi\nVersion: 0.2.11\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in {**files, **meta}.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, *meta, f"{info}/RECORD"]))
    slim_wheels(wheel.parent)
    with zipfile.ZipFile(wheel) as z:
        assert "pretty_midi/TimGM6mb.sf2" not in z.namelist() and "pretty_midi/__init__.py" in z.namelist()
        assert "TimGM6mb" not in z.read(f"{info}/RECORD").decode()
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
    subprocess.run([*cmd, str(wheel)], check=True, capture_output=True)
    assert (site / "pretty_midi" / "__init__.py").read_bytes() == b"VALUE = 7\n"
    assert not (site / "pretty_midi" / "TimGM6mb.sf2").exists()


def test_the_pack_folder_is_git_ignored():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("gpu_pack/run.sh", "gpu_pack/wheels/x.whl", "gpu_out/gpu-8m/config.json"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, path


def test_package_list_logic():
    graph = {
        "musicrel": [
            "torch>=2",
            "midi[extra1]",
            "lightning; extra == 'train'",
            "fastapi",
            "fastapi; extra == 'serve'",
            "datasketch; extra == 'train'",
            "music21; extra == 'corpus'",
        ],  # fmt: skip
        "torch": ["typing-extensions", "filelock"],
        "lightning": ["torch", "pyyaml", "tqdm"],
        "midi": ["six", "old-backport; python_version < '3.11'", "plugin; extra == 'extra1'"],
        "plugin": ["typing_extensions", "protobuf; sys_platform == 'linux'"],
        "fastapi": ["starlette"],
        **{n: [] for n in ("typing-extensions", "filelock", "pyyaml", "tqdm", "six", "protobuf")},
        "datasketch": [],
    }
    # the train extra is in, the server's packages (an extra, or a core dependency of older metadata), what
    # only `prepare` needs (datasketch) and the other extras are left out; markers are those of the GPU
    # machine (python 3.12, linux); what torch and lightning bring (typing-extensions, pyyaml, tqdm) and
    # protobuf are there already
    requires = lambda name: graph.get(normalize(name))  # noqa: E731 (as metadata, by normalized name)
    assert missing_on_gpu(requires) == ["midi", "plugin", "six"]
    del graph["six"]
    with pytest.raises(MusicrelError, match="six") as exc:
        missing_on_gpu(requires)
    assert exc.value.code == "not_installed"

    need = set(missing_on_gpu())  # this environment's real metadata
    assert {"pretty-midi", "mido", "jsonargparse", "docstring-parser", "typeshed-client"} <= need
    assert "tensorboardx" in need
    assert need.isdisjoint({"torch", "lightning", "numpy", "safetensors", "tqdm", "pyyaml", "protobuf"})
    assert need.isdisjoint({"datasketch", "scipy"})  # 34 MiB that only `prepare` needs
    assert need.isdisjoint({"fastapi", "uvicorn", "pydantic-settings", "prometheus-client"})


def test_gpu_configs_state_their_parameter_counts():
    """The counts written in configs/gpu-*.yaml are those of the real model at each context."""
    import yaml

    from musicrel.midi.codec import EventCodec
    from musicrel.model.config import ModelConfig
    from musicrel.model.transformer import MusicTransformer

    base = yaml.safe_load((REPO / "configs" / "gpu.yaml").read_text())
    assert base["trainer"]["precision"] == "bf16-mixed" and base["model"]["compile"] is True
    assert base["trainer"]["max_time"] == "00:00:23:00" and base["model"]["config"]["max_seq_len"] == 1024
    for size in ("2m", "8m", "20m"):
        path = REPO / "configs" / f"gpu-{size}.yaml"
        text = path.read_text()
        stated = re.findall(r"([\d,]+) at (?:max_seq_len )?(\d+)", text)
        assert [int(ctx) for _, ctx in stated] == [512, 1024, 2048], path
        fields = {**base["model"].get("config", {}), **yaml.safe_load(text)["model"]["config"]}
        for count, ctx in stated:
            cfg = ModelConfig(vocab_size=EventCodec().vocab_size, **{**fields, "max_seq_len": int(ctx)})
            with torch.device("meta"):
                n = MusicTransformer(cfg).num_parameters()
            assert n == int(count.replace(",", "")), (path.name, ctx, n)


def _block_server_packages(folder: Path) -> set[str]:
    """A sitecustomize that makes the modules of the server-only packages unimportable, as on the GPU
    machine: the training path must not need them."""
    from importlib import metadata

    from training.pack import GPU_HAS, SERVER_ONLY, training_requirements

    there = closure(GPU_HAS, strict=False) | closure(training_requirements(), stop=GPU_HAS)
    gone = closure(SERVER_ONLY, strict=False) - there
    blocked = {
        module
        for module, dists in metadata.packages_distributions().items()
        if {normalize(d) for d in dists} <= gone
    }
    assert {"fastapi", "uvicorn", "prometheus_client"} <= blocked
    folder.mkdir()
    # None in sys.modules: `import x` fails and importlib.util.find_spec(x) answers None, as when absent
    code = f"import sys\nsys.modules.update(dict.fromkeys({sorted(blocked)!r}))\n"
    (folder / "sitecustomize.py").write_text(code)
    return blocked


# What a CPU needs instead of the GPU settings, and a model small enough for seconds.
CPU_TINY = [
    "--trainer.accelerator", "cpu", "--trainer.precision", "32-true", "--model.compile", "false",
    "--trainer.max_steps", "2", "--trainer.val_check_interval", "2",
    "--model.config.n_layers", "2", "--model.config.d_model", "32", "--model.config.n_heads", "2",
    "--model.config.d_ff", "64",
    "--model.warmup_steps", "1", "--model.decay_steps", "2",
    "--data.batch_size", "2", "--data.examples_per_epoch", "8", "--data.num_workers", "1",
]  # fmt: skip


def _run_sh(pack: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    cmd = ["bash", str(pack / "run.sh"), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.long(60)
def test_run_sh_starts_waits_and_collects_on_a_cpu(tiny_data, tmp_path):
    """The steps a GPU lease takes, one device command each: start (returns while training goes on in its own
    session), status, wait, collect."""
    from musicrel.generation.decode import generate
    from musicrel.model.checkpoint import load_codec, load_model

    pack = tmp_path / "pack"
    pack_gpu(tiny_data, pack, wheels=False)
    _block_server_packages(tmp_path / "block")
    shard_mib = 0.03
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(tmp_path / "block"),
        "OUT": str(tmp_path / "out"),
        "RUNS": str(tmp_path / "runs"),
        "SITE": str(tmp_path / "site"),
        "MAX_SHARD_MIB": str(shard_mib),
    }

    def run_sh(*args):
        return _run_sh(pack, env, *args)

    nothing = run_sh("collect")
    assert nothing.returncode == 2 and "no run started" in nothing.stderr
    started = run_sh("start", "8m", "32", "--", *CPU_TINY)
    assert started.returncode == 0, started.stderr[-4000:]
    assert "started gpu-8m-32" in started.stdout
    assert sorted(p.name for p in (pack / "data").glob("*.npy")) == sorted(ARRAYS)  # unpacked beside the .xz
    status = run_sh("status")
    assert status.returncode == 0 and re.match(r"gpu-8m-32: (running|ended)", status.stdout)
    waited = run_sh("wait", "280")
    assert waited.returncode == 0, (waited.stdout + waited.stderr)[-4000:]
    assert "gpu-8m-32: ended" in waited.stdout and "done at step 2" in waited.stdout
    collected = run_sh("collect")
    assert collected.returncode == 0, collected.stderr[-4000:]

    folder = tmp_path / "out" / "gpu-8m-32"  # run name: size and context
    names = sorted(p.name for p in folder.iterdir())
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) >= 2 and "model.safetensors" not in names
    assert {"model.safetensors.index.json", "config.json", "MODEL_CARD.md", "metrics.csv"} <= set(names)
    assert "train.log" in names
    assert len(names) <= 8  # what one device command brings back
    assert all((folder / n).stat().st_size <= shard_mib * 2**20 for n in shards)
    assert "best-step=2" in (folder / "MODEL_CARD.md").read_text()  # validated at step 2: the best exported
    with open(folder / "metrics.csv") as f:
        assert "val_nll" in f.readline()

    model, codec = load_model(folder), load_codec(folder)
    assert (model.cfg.n_layers, model.cfg.d_model, model.cfg.max_seq_len) == (2, 32, 32)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    prompt = torch.tensor([[codec.bos_id]])
    tokens = [int(t) for t in generate(model, prompt, 8, generators=[torch.Generator().manual_seed(0)])]
    assert len(tokens) == 8 and all(0 <= t < codec.vocab_size for t in tokens)


def test_run_sh_wait_fails_on_a_failed_run(tiny_data, tmp_path):
    """A run that dies: `wait` fails and shows why. It dies at its first import (a `lightning` that raises)
    rather than at a bad override, which LightningCLI reports only after importing lightning: 8 CPU-s here."""
    pack = tmp_path / "pack"
    pack_gpu(tiny_data, pack, wheels=False)
    broken = tmp_path / "broken" / "lightning"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("no lightning on this machine")\n')
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "RUNS": str(tmp_path / "runs"),
        "PYTHONPATH": str(broken.parent),
    }

    def run_sh(*args):
        return _run_sh(pack, env, *args)

    assert run_sh("start", "nosuchsize").returncode == 2
    started = run_sh("start", "8m", "32")
    assert started.returncode == 0, started.stderr
    waited = run_sh("wait")
    assert waited.returncode == 2 and "the run failed" in waited.stderr
    assert "no lightning on this machine" in waited.stdout  # the log's tail says why
