"""postbox from Python.

- ``postbox.outbox``: write events to the transactional outbox in your own
  database transaction (psycopg 3, asyncpg, SQLAlchemy, sqlite3,
  aiosqlite); ``postbox relay`` sends them on.
- ``postbox.dedup``: per-handler dedup in the handler's own transaction,
  on the table Go's ``dedup`` uses.
- ``postbox.runner``: an asyncio runner of an inbox's items over the HTTP
  API (lease, extend, ack, nack).
- ``postbox.api``: a typed client of the operator API.
- ``postbox.webhooks``: verify the Standard Webhooks signatures postbox
  puts on what it pushes.

The contract the outbox and dedup follow is docs/OUTBOX.md.
"""

from ._ids import new_event_id
from .errors import (
    DuplicateEventError,
    InvalidEventError,
    InvalidKeyError,
    PostboxError,
    SchemaError,
    TransactionError,
)

__version__ = "0.1.0"

__all__ = [
    "new_event_id",
    "PostboxError",
    "InvalidEventError",
    "DuplicateEventError",
    "TransactionError",
    "SchemaError",
    "InvalidKeyError",
    "__version__",
]
