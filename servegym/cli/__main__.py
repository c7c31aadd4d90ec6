"""``python -m servegym.cli`` runs the ``servegym`` command."""

from servegym.cli.root import main

main()
