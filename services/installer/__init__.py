"""The installer service."""
