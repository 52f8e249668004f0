"""Resources a request holds: KV pages, a GDN state slot, a position offset.

Plain Python, no torch: each resource admits a request's next tokens (or refuses with a reason),
commits them after the step, and gives everything back on free or offload.
"""
