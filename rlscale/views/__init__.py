"""Presentation for the CLI and dashboard: words, report, page, charts, plots; fitting returns numbers and codes."""
