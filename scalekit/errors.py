"""Errors a user can act on: each names the field and the values it allows."""


class ConfigError(ValueError):
    """A RunConfig field holds a value scalekit cannot run."""


class ToggleUnavailable(ConfigError):
    """A toggle was asked for that this machine or this model cannot provide; the message says why."""
