"""A Quart app (Flask's API on asyncio)."""
from quart import Quart, jsonify, request

app = Quart(__name__)


@app.route("/")
async def index():
    return "hello from quart\n", 200, {"X-Framework": "quart"}


@app.route("/echo", methods=["POST"])
async def echo():
    return jsonify(await request.get_json())
