"""``python -m servegym`` runs the ``servegym`` command."""

from servegym.cli import main

main()
