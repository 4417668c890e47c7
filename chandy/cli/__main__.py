"""``python -m chandy.cli``: the ``chandy`` command."""

from chandy.cli import main

main()
