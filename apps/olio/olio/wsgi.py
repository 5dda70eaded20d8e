"""The WSGI entry point both deployments serve: `gunicorn olio.wsgi:app`, or a Sprout lambda
whose f.py does `from olio.wsgi import app`."""

from .web import create_app

app = create_app()
