"""Moved to harness.diagnosis.identity (diagnosis is its home); kept so that importers of the
GPU tier keep working."""

from harness.diagnosis.identity import SlotIdentity, identify_slots

__all__ = ["SlotIdentity", "identify_slots"]
