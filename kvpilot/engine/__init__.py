"""kvpilot's inference engine. Importing this package imports no torch; submodules do."""
