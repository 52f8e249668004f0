"""Benches of the gate's own parts and of a served API process (`python -m gate.tools.<name>`):
the load client alone against a fake SSE server, and where a streamed token's API CPU goes."""
