"""gradwatch's wire protocol: message names, JSON codec and spool files.

Standard library only, so the training side and the server share it without
importing each other's dependencies. See docs/PROTOCOL.md.
"""

from .codec import dumps, loads, to_float
from .messages import PROTOCOL_VERSION
from .spool import SpoolError, SpoolWriter, read_spool

__all__ = [
    "PROTOCOL_VERSION",
    "SpoolError",
    "SpoolWriter",
    "dumps",
    "loads",
    "read_spool",
    "to_float",
]
