"""Golden bundles: what training saw, frozen to disk, and the code that regenerates it."""
