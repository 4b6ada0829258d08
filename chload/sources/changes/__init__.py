"""Change capture: source tables followed from their change streams."""
