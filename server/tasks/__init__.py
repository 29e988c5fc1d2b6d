"""The service's tasks, each one definition (server/tasks/base.py's `Task`): continuation.py,
accompaniment.py, infill.py. Their routes, form checks and streams are made from these
(server/routes/tasks.py, server/tasks/stream.py); a new task is a module here and a line in TASKS."""

from server.tasks.accompaniment import ACCOMPANIMENT
from server.tasks.continuation import CONTINUATION
from server.tasks.infill import INFILL

TASKS = (CONTINUATION, ACCOMPANIMENT, INFILL)
