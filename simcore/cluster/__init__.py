"""A cluster of GPU nodes on a network fabric, and engines placed on it."""
