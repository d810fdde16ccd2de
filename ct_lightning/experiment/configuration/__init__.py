"""Configuration: the settings table, recipe options, input checks and start-up choices."""
