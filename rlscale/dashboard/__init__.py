"""`rlscale dashboard`: a live web page over the store, read-only, beside a running sweep (docs/dashboard.md)."""
