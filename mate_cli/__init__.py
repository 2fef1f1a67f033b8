"""mate_cli: a Hydra-driven experiment toolkit for transformers over large tables (MATE, PointR)."""

__version__ = "0.1.0"
