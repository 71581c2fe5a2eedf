"""Analytic cost model: compute, memory, communication, pipeline, composed per step (docs/design.md, "Cost model").

Pure functions of typed inputs. No framework imports, no solver calls.
"""
