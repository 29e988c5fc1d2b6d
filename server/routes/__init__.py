"""The HTTP routes, one thin module per resource: each parses a request (its dependencies in server/deps.py),
submits the work (server/continuations.py, streams.py, accompaniments.py, infills.py) and renders the
answer."""

from fastapi import APIRouter

from server.routes import accompaniments, continuations, health, infills, model, motifs, page

router = APIRouter()
# In this order in the OpenAPI document.
for resource in (continuations, motifs, model, page, health, accompaniments, infills):
    router.include_router(resource.router)
