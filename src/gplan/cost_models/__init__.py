"""Analytic cost model: compute, memory, communication, pipeline, composed per step (DESIGN.md §7).

Pure functions of typed inputs. No framework imports, no solver calls.
"""
