"""Presentation: the decision and reasons in words (wording.py), the report (report.py, report_text.py), the study
page and its charts (page.py, page_charts.py, assets/), and plots (plots.py). Rendered by the CLI and the dashboard;
the fitting layer returns numbers and codes."""
