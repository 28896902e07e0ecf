"""Honest control header: nothing. With wrap_solution the candidate is the problem's
known-good solution exactly (used with spec overrides such as max_launches: 1)."""
