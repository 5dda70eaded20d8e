"""A lambda with a package: renders a greeting with Jinja2 (listed in requirements.txt)."""
import jinja2

TEMPLATE = jinja2.Template("Hello, {{ name | title }}! Rendered by Jinja2 {{ version }}.")


def f(event):
    name = (event or {}).get("name", "world")
    return {"greeting": TEMPLATE.render(name=name, version=jinja2.__version__)}
