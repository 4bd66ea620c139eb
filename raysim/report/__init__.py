"""Figures of finished runs: `raysim report` on one run (`reports`, with the reports plugins register) or
several overlaid (`compare`), the client timeline (`timeline`), and what every figure shares (`figures`)."""
from raysim.report.figures import save_figure
from raysim.report.reports import register_report, report

__all__ = ["register_report", "report", "save_figure"]
