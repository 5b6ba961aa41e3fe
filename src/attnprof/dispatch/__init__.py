"""Which attention backend a call really took, and what SDPA's own checks say about the others.

The lowest of the torch layers (above `workload`, `backends`, `stderr`): the variants (`sdpa-<backend>`'s
`supports`), `run()` (the watcher around the measured call), the models' adapter and the audit all ask these two
modules, so they import nothing of those: `watch.py` (the dispatch watcher) and `sdpa_checks.py` (fastest backend
of a device, `can_use_*` refusals, CPU counterfactuals). Explaining a call in words is the audit's
(`audit/reasons.py`), because it runs a variant to ask.
"""
