"""An out-of-tree SGLang model package (SGLANG_EXTERNAL_MODEL_PACKAGE): SGLang imports each
module here and registers its `EntryClass` ahead of its own models (models/registry.py)."""
