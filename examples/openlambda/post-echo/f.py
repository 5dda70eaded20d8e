"""A Flask app that answers a POST with its body, byte for byte, and its content type."""
from flask import Flask, request

app = Flask(__name__)


@app.route("/", methods=["POST"])
def echo():
    return request.get_data(), 200, {"Content-Type": request.content_type or "application/octet-stream"}
