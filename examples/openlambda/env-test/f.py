"""Says what ol.yaml's environment set, as the process sees it and as .env holds it."""
import os

NAMES = ["GREETING", "DATABASE_URL", "DEBUG_MODE", "WORKERS", "QUOTED"]
AT_IMPORT = {name: os.environ.get(name) for name in NAMES}


def f(event):
    with open(os.path.join(os.path.dirname(__file__), ".env")) as dotenv:
        lines = dotenv.read().splitlines()
    return {"at_import": AT_IMPORT, "dotenv": lines}
