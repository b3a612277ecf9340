"""Engine adapters: one small class per engine behind `harness.engines.base.Engine`."""
