"""A WSGI app in main.py under another name: ol.yaml's OL_ENTRY_FILE and OL_WSGI_ENTRY."""
import json


def my_wsgi_app(environ, start_response):
    body = json.dumps({"entry_file": __file__.rsplit("/", 1)[-1], "module": __name__,
                       "path": environ["PATH_INFO"]}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
