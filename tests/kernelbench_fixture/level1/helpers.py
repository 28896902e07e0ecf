"""Not a problem: a helper module beside the problems."""
