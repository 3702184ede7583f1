"""`python -m proxy serve` works where the `velo` script is not on PATH."""
from .entry import main

raise SystemExit(main())
