"""Fidelity tests; the package makes their reference transcriptions importable as ``fidelity.reference_*``."""
