"""`pip install .` without extras: the codec, the model and generation import with the core dependencies
alone (pyproject's [serve], [train] and [eval] extras stay out), and so does the `musicrel` command's help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib


REPO = Path(__file__).resolve().parents[2]

# Every module a user of the library imports: the codec, the model, generation, the public names.
LIBRARY = """
import importlib, pkgutil, musicrel
for pkg in ("musicrel.midi", "musicrel.model", "musicrel.generation"):
    for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__, pkg + "."):
        importlib.import_module(info.name)
from musicrel import continue_midi, load_model, load_codec, EventCodec, Controls, ModelConfig
from musicrel.cli import build_parser
build_parser().parse_args(["generate", "--help"])
"""

# An import of any extra's package fails, as it would where it is not installed.
BLOCK = """
import importlib.abc, sys
BLOCKED = {blocked!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (an extra)", name=name)
sys.meta_path.insert(0, Block())
"""


def _extras_modules() -> set[str]:
    """The import names of the packages only the extras require (pyproject's own lists)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {req.split(">")[0].split("[")[0].lower() for req in project["dependencies"]}
    names = set()
    for extra in ("serve", "train", "eval"):
        for req in project["optional-dependencies"][extra]:
            name = req.split(">")[0].split("[")[0].lower()
            if name not in core:
                names.add(name)
    imports = {"python-multipart": "python_multipart", "pydantic-settings": "pydantic_settings",
               "prometheus-client": "prometheus_client", "fastapi-offline": "fastapi_offline",
               "tensorboardx": "tensorboardX", "pyyaml": "yaml"}  # fmt: skip
    return {imports.get(n, n) for n in names} | {"pydantic", "starlette"}


def test_the_extras_hold_the_server_training_and_pictures():
    blocked = _extras_modules()
    assert {"fastapi", "uvicorn", "lightning", "jsonargparse", "matplotlib"} <= blocked
    assert "torch" not in blocked and "pretty_midi" not in blocked


def test_the_library_imports_without_the_extras():
    code = BLOCK.format(blocked=sorted(_extras_modules())) + LIBRARY
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
