"""schemathesis hooks for tests/api/openapi.rs (loaded through SCHEMATHESIS_HOOKS).

The run checks `positive_data_acceptance`: every request that the document calls valid must
be accepted. The document states every rule that JSON Schema can state (patterns, lengths,
minimums, enums, required parameters). These hooks touch only the requests schemathesis
means to be valid (positive cases), and only for the rules below, which no schema can state;
each is described in the document's text and has its own API test. Requests meant to be
invalid (negative cases) are left as generated.
"""

import re
from datetime import datetime, timezone

import schemathesis

# A timeline entry's row key (the `RowKey` schema): 19 digits, `_`, a lower-case UUID.
ROW_KEY = re.compile(r"[0-9]{19}_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# Longest subject id, series name, tag or client event id, and longest event kind, in UTF-8
# bytes. JSON Schema's maxLength counts characters, so 256 characters of `é` match a
# `maxLength: 256` schema and are still 512 bytes.
MAX_NAME_BYTES = 256
MAX_KIND_BYTES = 128


def _time(text):
    """An RFC 3339 time as a comparable datetime, or None."""
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


def _in_range_utc(text):
    """Whether an RFC 3339 time lies within years 1 to 9999 once in UTC."""
    try:
        return _time(text).astimezone(timezone.utc) is not None
    except (AttributeError, OverflowError, ValueError):
        return False


def _is_positive(case):
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive


def _too_long(text, limit):
    return isinstance(text, str) and len(text.encode("utf-8")) > limit


def _names_over_their_byte_limit(case):
    """Whether a name, tag, id or kind of this request is over its limit in bytes."""
    values = list(case.path_parameters.values())
    query = case.query or {}
    values += [query.get("subject"), query.get("tag")]
    values += str(query.get("names", "")).split(",")
    body = case.body if isinstance(case.body, dict) else {}
    values += [body.get("id")]
    if isinstance(body.get("tags"), list):
        values += body["tags"]
    if isinstance(body.get("series"), list):
        values += [one.get("name") for one in body["series"] if isinstance(one, dict)]
    return any(_too_long(value, MAX_NAME_BYTES) for value in values) or _too_long(
        body.get("kind"), MAX_KIND_BYTES
    )


@schemathesis.hook
def filter_case(context, case):
    if not _is_positive(case):
        return True
    # Byte limits: see MAX_NAME_BYTES.
    if _names_over_their_byte_limit(case):
        return False
    # A notification marker's `seen_until` must lie within the years fanline keeps (1 to
    # 9999), and its `read` names at most 99 groups (one transaction with the marker).
    if case.method == "PUT" and case.path == "/v1/subjects/{subject}/notifications/marker":
        body = case.body if isinstance(case.body, dict) else {}
        until = body.get("seen_until")
        if until is not None and not _in_range_utc(until):
            return False
        if isinstance(body.get("read"), list) and len(body["read"]) > 99:
            return False
    # A subject cannot follow itself; a schema cannot say that one parameter differs from
    # another.
    if case.method == "PUT" and case.path == "/v1/subjects/{subject}/following/{target}":
        parameters = case.path_parameters
        if parameters.get("subject") == parameters.get("target"):
            return False
    return True


@schemathesis.hook
def map_case(context, case):
    if not _is_positive(case):
        return case
    # Line protocol: a schema can say "text", not "lines of line protocol"; tests/api/
    # line_protocol.rs covers the lines themselves.
    if case.path == "/api/v2/write":
        case.body = "schemathesis,source=hooks value=1"
    query = dict(case.query or {})
    # A cursor is valid only if this server issued it for this listing (it is signed): the
    # `Cursor` schema says its shape, but no generated string of that shape was issued.
    query.pop("cursor", None)
    # The same for `after` given as a cursor: its other forms, a time or a row key, are kept.
    after = query.get("after")
    if isinstance(after, str) and ":" not in after and not ROW_KEY.fullmatch(after):
        del query["after"]
    # The same for a marker's `last_read` given as a cursor: it is required, so it becomes a
    # time instead.
    body = case.body
    if case.path == "/v1/subjects/{subject}/marker" and isinstance(body, dict):
        last_read = body.get("last_read")
        if isinstance(last_read, str) and ":" not in last_read and not ROW_KEY.fullmatch(last_read):
            case.body = {**body, "last_read": "2026-01-01T00:00:00Z"}
    # `from` must not be after `to`: a schema cannot compare two parameters.
    start, end = _time(query.get("from")), _time(query.get("to"))
    if start is not None and end is not None and start > end:
        query["from"], query["to"] = query["to"], query["from"]
    # `agg` needs `step`: a schema cannot make one parameter depend on another.
    if case.path == "/v1/series/{series}/points" and "step" not in query:
        query.pop("agg", None)
    if query != (case.query or {}):
        case.query = query
    return case
