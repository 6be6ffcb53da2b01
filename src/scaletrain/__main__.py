"""`python -m scaletrain` entry point."""

from scaletrain.cli.main import entry

if __name__ == "__main__":
    entry()
