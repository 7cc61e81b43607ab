"""Request and response shapes on the wire, and the conversions between them and what the engine takes."""
