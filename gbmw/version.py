"""gbmw's version: one home, read by the package (`gbmw.__version__`), the planner's provenance and
pyproject.toml (setuptools' dynamic version)."""

__version__ = "0.1.0"
