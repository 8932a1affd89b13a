"""The shipped recipes, installed as the data package `streamrl.configs` (read through streamrl.resources)."""
