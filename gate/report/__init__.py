"""Rendering a finished session from its records: tables, paired deltas, plots, profiles."""
