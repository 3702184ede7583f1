"""`python -m proxy serve` works where the `velo` script is not on PATH."""
from .cli import main

raise SystemExit(main())
