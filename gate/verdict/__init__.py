"""Judging a session's rounds: the runs as a frame, the verdict rule and its calibration."""
