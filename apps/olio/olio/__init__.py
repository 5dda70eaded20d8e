"""Olio, the Cloudstone social-events application: a Flask WSGI app (`olio.wsgi:app`)."""
