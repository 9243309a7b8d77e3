"""Generation hooks for tests/api-fuzz/run.sh, loaded through SCHEMATHESIS_HOOKS.

A timer's payload is base64 of a JSON document (`format: base64-json` in
host/openapi.json). A string drawn from the schema alone is almost never
that, so nearly every generated schedule would be refused and the firer
never exercised; this tells schemathesis how to draw one.
"""

import base64
import json

import schemathesis
from hypothesis import strategies as st

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=10,
)

schemathesis.openapi.format(
    "base64-json",
    JSON_VALUES.map(lambda value: base64.b64encode(json.dumps(value).encode()).decode()),
)
