"""Tamper header (the known-good softmax is appended): imports cupy through exec of a string,
which no AST check sees. The import guard looks through exec'd code to the candidate's file,
refuses it and flags forbidden_import:cupy."""
try:
    exec("import cu" + "py as _cp")
except ImportError:
    pass
