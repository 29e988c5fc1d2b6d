"""The README's quick-start commands, run as written: the blocks marked `<!-- readme-test: NAME -->`.

- `curl`: against `musicrel serve` on the shipped model (what `make run` starts; only the port differs: a free
  one instead of 8000), the answer is a MIDI file of notes.
- `library`: the Python block, executed from a folder laid out like the repository root, writes a MIDI file.
- `train`: the shell block, from a folder with the repository's `configs/` and a `.venv/bin/activate` that
  puts this interpreter's `musicrel` first on PATH, and `my_midi/` written by the tests' own code: it prints
  the loss as it goes and where the checkpoint went, the exported folder loads, and a MIDI file is generated.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pretty_midi
import pytest

from tests.server.conftest import start_server
from tests.training.conftest import write_pattern_midi

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- readme-test: (\S+) -->\n```(\w+)\n(.*?)\n```", re.S)


def readme_blocks() -> dict[str, tuple[str, str]]:
    """NAME -> (language, code) of every marked fenced block of README.md."""
    text = (REPO / "README.md").read_text()
    blocks = {name: (lang, code) for name, lang, code in BLOCK.findall(text)}
    assert len(blocks) == len(BLOCK.findall(text)), "two README blocks share a readme-test name"
    return blocks


def _like_the_repo(folder: Path, *names: str) -> Path:
    """`folder` with links to the repository's `names` (configs, server, checkpoints), nothing else."""
    folder.mkdir()
    for name in names:
        (folder / name).symlink_to(REPO / name, target_is_directory=True)
    return folder


def _notes(path: Path) -> int:
    return sum(len(i.notes) for i in pretty_midi.PrettyMIDI(str(path)).instruments)


def test_the_readme_marks_the_quick_start_blocks_and_make_run_serves_what_curl_asks():
    blocks = readme_blocks()
    assert {name: lang for name, (lang, _) in blocks.items()} == {
        "curl": "bash",
        "library": "python",
        "train": "bash",
    }
    readme = (REPO / "README.md").read_text()
    assert "make run " in readme and "make test " in readme
    makefile = (REPO / "Makefile").read_text()
    # The curl block's URL is where `make run` serves by default.
    assert "serve --checkpoint $(CHECKPOINT) --host $(HOST) --port $(PORT)" in makefile
    host = re.search(r"^HOST \?= (\S+)$", makefile, re.M).group(1)
    port = re.search(r"^PORT \?= (\S+)$", makefile, re.M).group(1)
    assert f"http://{host}:{port}/v1/continuations" in blocks["curl"][1]


def test_readme_curl_gets_a_continuation_from_the_shipped_model(tmp_path):
    _, code = readme_blocks()["curl"]
    workdir = _like_the_repo(tmp_path / "repo", "server")
    with start_server(REPO / "checkpoints" / "default", tmp_path, cli=True) as server:
        command = code.replace("http://127.0.0.1:8000", server.url)
        assert command != code
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=workdir,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    midi = workdir / "continuation.mid"
    assert midi.read_bytes()[:4] == b"MThd", midi.read_bytes()[:200]
    assert _notes(midi) > 0


@pytest.fixture
def one_thread():
    # A small model on a shared 2-core machine: one torch thread is several times faster than two.
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_readme_library_call_writes_a_continuation(tmp_path, monkeypatch, one_thread):
    _, code = readme_blocks()["library"]
    workdir = _like_the_repo(tmp_path / "repo", "server", "checkpoints")
    monkeypatch.chdir(workdir)
    scope: dict = {}
    exec(compile(code, "README.md:library", "exec"), scope)  # noqa: S102 (the README's own code)
    outs = scope["outs"]
    assert len(outs) == 2 and all(isinstance(pm, pretty_midi.PrettyMIDI) for pm in outs)
    assert _notes(workdir / "continuation.mid") > 0
    assert 0 < outs[0].get_end_time() <= 10.5  # seconds=10 of continuation


@pytest.fixture
def user_repo(tmp_path) -> Path:
    """A repository root as a user has it after `make`: configs/, .venv/bin/activate, and their my_midi/."""
    repo = _like_the_repo(tmp_path / "repo", "configs")
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "musicrel").exists(), f"no musicrel script beside {sys.executable}"
    activate = repo / ".venv" / "bin" / "activate"
    activate.parent.mkdir(parents=True)
    activate.write_text(f'export VIRTUAL_ENV="{bin_dir.parent}"\nexport PATH="{bin_dir}:$PATH"\n')
    midi = repo / "my_midi"
    midi.mkdir()
    for i, root in enumerate((48, 50, 52, 55, 57, 60)):
        write_pattern_midi(midi / f"tune_{i}.mid", root)
    return repo


@pytest.mark.long(40)
def test_readme_training_path_gives_an_exported_model_and_its_music(user_repo):
    from musicrel.model.checkpoint import load_model

    _, code = readme_blocks()["train"]
    # One torch thread per command: on a shared 2-core machine two are slower (the commands are as written).
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=user_repo, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout

    # The loss as it goes, falling on these repetitive tunes, and where the checkpoint went.
    losses = [float(x) for x in re.findall(r"^step \d+/12  loss (\S+)", out, re.M)]
    assert len(losses) == 12 and losses[-1] < losses[0], out
    assert re.search(r"^step 12  val_nll \d", out, re.M), out
    assert "  last: runs/tiny/version_0/checkpoints/last.ckpt\n" in out, out
    assert "musicrel export runs/tiny/version_0/checkpoints/last.ckpt --out" in out

    model = load_model(user_repo / "checkpoints" / "mine")
    assert model.cfg.n_layers == 2 and model.cfg.d_model == 32  # configs/tiny.yaml's shape
    generated = sorted((user_repo / "out" / "mine").glob("*.mid"))
    assert len(generated) == 2 * 6, generated  # two samples of each of the six files
    assert all(_notes(path) > 0 for path in generated)
