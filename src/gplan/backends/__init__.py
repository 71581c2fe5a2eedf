"""Execution backends: turn a plan.json into a running job (DESIGN.md §9).

Launchers never import a framework; workers run inside the job and import only their own.
"""
