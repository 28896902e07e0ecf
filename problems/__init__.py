"""Problem folders (data). Installed as the package data `kb_env.problems`; each folder holds
problem.yaml, reference.py, optional baseline.py and solutions/*.py."""
