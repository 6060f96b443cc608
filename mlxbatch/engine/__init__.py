"""The engine layer: prompts, labels, batch layouts, planning, footprints, scorers."""
