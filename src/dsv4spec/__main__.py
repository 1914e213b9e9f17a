"""``python -m dsv4spec``: the ``dsv4spec`` command."""

from dsv4spec.cli import main

raise SystemExit(main())
