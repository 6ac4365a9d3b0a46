"""The deterministic simulator (sim) and the golden scenario scripts (scenario)."""
