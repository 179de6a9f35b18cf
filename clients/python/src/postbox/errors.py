"""The errors postbox's Python client raises."""

from __future__ import annotations


class PostboxError(Exception):
    """The base of every error this package raises."""


class InvalidEventError(PostboxError, ValueError):
    """An event that cannot go into the outbox; the message names the field.

    Nothing is written: every event of an insert is checked before the
    first row is.
    """


class DuplicateEventError(PostboxError):
    """An event whose id is in the outbox already.

    As with Go's ``outbox.ErrDuplicate``: no row is written for the ids in
    ``ids``, the other events of the same insert are, and the caller's
    transaction stays usable, so the caller decides whether to commit.
    """

    def __init__(self, ids: list[str]):
        self.ids = ids
        super().__init__(f"event id already in the outbox: {', '.join(ids)}")


class TransactionError(PostboxError):
    """The connection or transaction given cannot take the write: it is
    closed, aborted, or not in a transaction (autocommit). Nothing is
    written."""


class SchemaError(PostboxError):
    """The database has no postbox table (outbox, inbox) where the
    connection looks: the connection is to another database or schema, or
    the table was never created. Nothing is written."""


class InvalidKeyError(PostboxError, ValueError):
    """A dedup handler name or id that is empty, too long or not text
    (Go's ``dedup.ErrInvalidKey``). Nothing is written."""
