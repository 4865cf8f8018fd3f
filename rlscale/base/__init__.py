"""What every layer shares: user errors, settings and paths. Imports nothing from rlscale's other packages."""
