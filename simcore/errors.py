"""Errors raised for bad user input: one sentence naming the field, file or line."""


class ConfigError(ValueError):
    """A configuration, scenario or data file is invalid; the message names where and why."""
