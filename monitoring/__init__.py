"""The monitoring bundle, installed as the data package `streamrl.monitoring` (read through streamrl.resources)."""
