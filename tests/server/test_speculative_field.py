"""The ``speculative`` body field (``SamplingParams.speculative``) against the
real server (n-gram speculation, k = 3): settings it cannot honour are a 400
naming the field, a request that turns speculation off equals the engine
without speculation and verifies nothing, and the acceptance record shows in
the answer's ``speculant`` field and in /metrics (by proposer)."""

from __future__ import annotations

import httpx
import pytest

from speculant import SamplingParams


def complete(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/completions", json={"prompt": "the cat sat on the mat, the cat",
                                                            "temperature": 0, "max_tokens": 24, **body}, timeout=60)


@pytest.mark.parametrize("value,message", [
    ({"enable": False}, "unknown field 'speculative.enable'; remove it"),
    ({"num_speculative_tokens": 9}, "SamplingParams.speculative.num_speculative_tokens=9 exceeds the engine's "
                                    "speculative.num_speculative_tokens=3"),
    ({"adaptive": 1}, "field 'speculative.adaptive': Input should be a valid boolean (got 1)"),
    ({"num_speculative_tokens": -1}, "field 'speculative.num_speculative_tokens': Input should be greater than or "
                                     "equal to 0 (got -1)"),
    ("off", "field 'speculative': Input should be a valid dictionary or object to extract fields from (got 'off')"),
])
def test_a_setting_the_engine_cannot_honour_is_a_400_naming_the_field(server, value, message):
    r = complete(server, speculative=value)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"], err
    assert err["param"] is None or err["param"].startswith("speculative"), err


def test_off_equals_no_speculation_and_the_record_says_so(server, reference):
    prompt = "the cat sat on the mat, the cat"
    want = reference.generate([prompt], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0]
    off = complete(server, speculative={"enabled": False}).json()
    # 2.0 is a JSON Schema integer: taken as k = 2 (the histogram below has at most 3 buckets)
    on = complete(server, speculative={"num_speculative_tokens": 2.0, "adaptive": False}).json()
    for answer in (off, on):
        assert answer["choices"][0]["text"] == want.outputs[0].text
    s_off, s_on = off["speculant"], on["speculant"]
    assert s_off["spec_steps"] == 0 and s_off["draft_tokens"] == 0 and s_off["accepted_length_histogram"] == []
    assert s_off["spec_off_steps"] == off["usage"]["completion_tokens"] - 1 and s_off["propose_s"] == 0.0
    hist = s_on["accepted_length_histogram"]
    assert sum(hist) == s_on["spec_steps"] > 0 and len(hist) <= 3  # 0..2 accepted of k = 2
    assert sum(a * n for a, n in enumerate(hist)) == s_on["accepted_tokens"]
    m = server.metrics()
    buckets = {k: v for k, v in m.items() if k.startswith("speculant_spec_accepted_length_bucket")}
    assert buckets and all('proposer="ngram"' in k for k in buckets), buckets
    count = m['speculant_spec_accepted_length_count{proposer="ngram"}']
    assert count == max(buckets.values()) == m["speculant_spec_drafts_total"]
    assert m["speculant_spec_off_steps_total"] >= s_off["spec_off_steps"]
