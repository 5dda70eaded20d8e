"""The in-sandbox runtime: ``helper.py`` runs inside every sandbox (standard library only)."""
