"""musku: production A/B tuning of server soft SKUs."""

__version__ = "0.1.0"
