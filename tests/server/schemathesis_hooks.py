"""Schemathesis hooks for ``test_openapi_fuzz.py`` (loaded through ``SCHEMATHESIS_HOOKS``).

``schema_valid_requests_run`` is schemathesis's ``positive_data_acceptance``
with one exception the schema states itself: a request it allows may still
be refused with a 400 whose ``code`` is in ``errors.BEYOND_SCHEMA_CODES``
(documented under 400), for causes no schema can express (a prompt too long
for this model, a regex that does not compile). Any other refusal of a
schema-valid request fails the run.
"""

from __future__ import annotations

import schemathesis

from speculant.server.errors import BEYOND_SCHEMA_CODES

ACCEPTED = {401, 404, 409, 429, 503}
"""As positive_data_acceptance: statuses that do not say the request was malformed."""


@schemathesis.check
def schema_valid_requests_run(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if status < 300 or status in ACCEPTED:
        return None
    code = None
    if status == 400:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code in BEYOND_SCHEMA_CODES:
            return None
    raise AssertionError(f"a request the schema allows was refused with {status} (code {code!r}): "
                         f"{response.text[:500]}")
