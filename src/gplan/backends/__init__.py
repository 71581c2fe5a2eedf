"""Execution backends: turn a plan.json into a running job (docs/design.md, "Backends").

Launchers never import a framework; workers run inside the job and import only their own.
"""
