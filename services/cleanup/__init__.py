"""The cleanup service."""
