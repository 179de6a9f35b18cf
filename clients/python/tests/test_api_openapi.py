"""The typed API client against docs/openapi.json: every route it calls
exists there with the body fields it sends, and every field of its answer
types is in the schema of that answer."""

from __future__ import annotations

import json
import typing

from conftest import REPO

from postbox import api


def openapi():
    return json.loads((REPO / "docs" / "openapi.json").read_text())


def test_routes_exist_with_their_body_fields():
    doc = openapi()
    for method, path, fields in api.ROUTES:
        op = doc["paths"].get(path, {}).get(method.lower())
        assert op is not None, f"{method} {path} is not in docs/openapi.json"
        if fields:
            schema = op["requestBody"]["content"]["application/json"]["schema"]
            if "$ref" in schema:
                schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
            props = set(schema.get("properties", {}))
            for s in schema.get("allOf", []):
                if "$ref" in s:
                    s = doc["components"]["schemas"][s["$ref"].rsplit("/", 1)[1]]
                props |= set(s.get("properties", {}))
            missing = set(fields) - props
            assert not missing, f"{method} {path}: body fields {sorted(missing)} are not in docs/openapi.json"


def test_answer_types_match_the_schemas():
    schemas = openapi()["components"]["schemas"]
    for name, cls in api.SCHEMAS.items():
        assert name in schemas, f"schema {name} is not in docs/openapi.json"
        props = set(schemas[name]["properties"])
        fields = set(typing.get_type_hints(cls))
        assert fields <= props, f"{cls.__name__}: {sorted(fields - props)} not in docs/openapi.json's {name}"
    # The item, the lease and the counts are complete: a new field in the
    # API shows here.
    for name in ("Item", "Lease", "Inbox", "ItemPage", "Extension", "SettleResults"):
        assert set(typing.get_type_hints(api.SCHEMAS[name])) == set(schemas[name]["properties"]), name


def test_the_client_calls_only_listed_routes():
    """Each path the client's source builds is in ROUTES."""
    import inspect
    import re

    src = inspect.getsource(api.API)
    used = set()
    for m in re.finditer(r'request\("([A-Z]+)", f?"([^"?]+)', src):
        path = re.sub(r"\{[^}]*\}", "{}", m.group(2))
        used.add((m.group(1), path))
    listed = {(mth, re.sub(r"\{[^}]*\}", "{}", p)) for mth, p, _ in api.ROUTES}
    assert used, "found no calls in the client's source"
    assert used <= listed, sorted(used - listed)
