"""Models the suite runs for real: the tiny MoE target and the EAGLE-3 draft as trained."""
