"""Command-line interface: one module per verb (see main.VERBS)."""
