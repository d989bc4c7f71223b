"""The fabric as a whole, needing neither bcc nor root: its description, and the logic that
places QPs across it (the coordinator's)."""
