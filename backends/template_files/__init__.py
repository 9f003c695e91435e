"""The files ``inferpool new-backend`` fills in (package data, read by backends.template)."""
