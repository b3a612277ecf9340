"""eagle3-conformance: certify that an engine feeds an EAGLE-3 draft what it was trained on."""

__version__ = "0.1.0"
