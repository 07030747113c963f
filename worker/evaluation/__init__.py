"""Measuring the citation policy from stored results: scores (`scoring`), judges (`judges`),
running arms and repeats (`experiment`), and the report (`report`, `charts`).
"""
