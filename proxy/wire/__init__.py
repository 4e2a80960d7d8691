"""The PostgreSQL v3 wire protocol, sans-IO: framing, message bodies, session state."""
