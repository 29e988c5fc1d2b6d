"""The HTTP routes: each task's made from its definition (server/routes/tasks.py, server/tasks/), the other
resources one thin module each (their dependencies in server/deps.py)."""

from fastapi import APIRouter

from server.routes import health, model, motifs, page
from server.routes.motifs import MOTIFS_PATH
from server.routes.tasks import task_router
from server.tasks import TASKS

router = APIRouter()
# In this order in the OpenAPI document.
for resource in (*map(task_router, TASKS), motifs.router, model.router, page.router, health.router):
    router.include_router(resource)

# Each form route and the model its fields come from (server/openapi.py tailors their copies): every task's
# and its stream's, and /v1/motifs' (the part of a continuation's form that decides the primer).
FORMS = (
    *(
        (path, "post", task.form.__name__)
        for task in TASKS
        for path in (task.path, *([f"{task.path}/stream"] if task.stream_summary else []))
    ),
    (MOTIFS_PATH, "post", "MotifParams"),
)
# The routes that generate (preparing a motif prefills it in the engine): admitted, counted in flight and
# drained the same way (server/middleware.py).
GENERATION_PATHS = frozenset(path for path, _, _ in FORMS)
