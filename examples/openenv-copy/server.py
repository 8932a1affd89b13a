"""The copy environment's FastAPI app, as OpenEnv's server/app.py makes one (HTTP and WebSocket endpoints).
Serve it yourself (`uvicorn server:app --port 8000`, then `task.env_url: http://127.0.0.1:8000`), or name it as
`task.env_app: server.py:app` and each streamrl actor serves it on a loopback port of its own."""

from openenv.core.env_server.http_server import create_app

from copy_environment import CopyEnvironment
from copy_models import CopyAction, CopyObservation

# An actor plays actors.prompts_per_generate x actors.group_size episodes at once, one session each.
app = create_app(CopyEnvironment, CopyAction, CopyObservation, env_name="copy", max_concurrent_envs=64)
