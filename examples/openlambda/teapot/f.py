"""A Flask app that owns its status, headers and body; ol.yaml lets GET and POST in only."""
from flask import Flask

app = Flask(__name__)


@app.route("/", methods=["GET", "POST"])
def brew():
    return "short and stout\n", 418, {"X-Teapot": "yes"}
