"""What turns runs into something a person reads: comparison summaries, tables, plots, CSV."""

from dssync.lab.report.summary import method_summary, time_to_target

__all__ = ["method_summary", "time_to_target"]
