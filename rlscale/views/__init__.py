"""Presentation: the decision in words, the report, the study page and its charts, and plots, rendered by the CLI
and the dashboard; the fitting layer returns numbers and codes."""
