"""The in-sandbox runtime: ``helper.py`` and the modules it loads run inside every sandbox (standard library only)."""
