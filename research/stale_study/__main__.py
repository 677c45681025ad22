"""``python -m research.stale_study``: :func:`.cli.main`."""

from .cli import main

raise SystemExit(main())
