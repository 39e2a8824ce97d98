"""transformer."""
