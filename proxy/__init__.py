"""openwop-seat: a transparent PostgreSQL wire-protocol proxy that serves OpenWOP event logs by era."""

__version__ = "0.1.0"
