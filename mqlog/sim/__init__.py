"""The deterministic simulator: ``python -m mqlog.sim --layer master_slave --seed N``."""
