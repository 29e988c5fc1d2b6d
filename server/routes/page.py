"""The web page: GET / (server/static/index.html) and GET /v1/examples, the example motifs it offers."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, JSONResponse, Response

from server.deps import SettingsDep
from server.schemas import Example

log = logging.getLogger("musicrel.server")
router = APIRouter()


@router.get("/v1/examples", response_model=list[Example], summary="Bundled example motifs for the web page")
async def examples(settings: SettingsDep) -> Any:
    folder = settings.static_dir / "examples"
    index = folder / "index.json"
    entries: list[dict[str, Any]] = []
    if index.is_file():
        try:
            entries = [e for e in json.loads(index.read_text()) if (folder / e["file"]).is_file()]
        except (ValueError, KeyError, TypeError):
            log.warning("ignoring unreadable %s", index)
    if not entries and folder.is_dir():
        entries = [{"name": p.stem.replace("_", " "), "file": p.name} for p in sorted(folder.glob("*.mid"))]
    return [
        Example(
            name=e["name"],
            file=e["file"],
            url=f"/static/examples/{e['file']}",
            description=e.get("description", ""),
        )
        for e in entries
    ]


@router.get("/", include_in_schema=False)
async def index(settings: SettingsDep) -> Response:
    page = settings.static_dir / "index.html"
    if page.is_file():
        return FileResponse(page, media_type="text/html")
    return JSONResponse({"name": "musicrel", "docs": "/docs", "api": "/v1/continuations"})
