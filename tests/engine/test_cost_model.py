"""The adaptive policy's cost model: the curve t(n)/t(1) (interpolation, a
measurement driven by an injected clock, so nothing here depends on timing),
the on-disk cache (written, read back, a corrupt file measured again), the
figures that skip the measurement, the proposer cost learnt from propose
timings, and the policy pricing drafts with a curve."""

from __future__ import annotations

import json

import pytest

from speculant import LLM
from speculant.config.models import SpeculativeConfig
from speculant.config.sampling_params import SamplingParams
from speculant.engine.cost_cache import DRAFT_TOKEN_COST_ENV, TOKEN_COST_ENV, CachedCurve, read_curve
from speculant.engine.cost_model import CostCurve, CostModel, Measurement, curves_agree, measure_curve
from speculant.engine.cost_watch import LIVE_WINDOW, CurveWatch
from speculant.engine.draft_length import AdaptiveDraftLength
from speculant.engine.request import Request, RequestStatus
from speculant.engine.runner_view import SequenceRunner


def test_curve_interpolates_extrapolates_and_never_falls():
    curve = CostCurve((1, 2, 4, 8), (1.0, 1.02, 1.03, 1.5))
    assert curve.cost(1) == 1.0 and curve.cost(0) == 0.0
    assert curve.cost(3) == pytest.approx(1.025)
    assert curve.cost(6) == pytest.approx(1.265)
    assert curve.cost(12) == pytest.approx(1.5 + 4 * (1.5 - 1.03) / 4)  # the last segment's slope
    noisy = CostCurve((1, 2, 4), (1.0, 1.1, 1.05))  # timing noise: 4 rows looked cheaper than 2
    assert noisy.ratios == (1.0, 1.1, 1.1)
    assert CostCurve.linear(0.2).cost(5) == pytest.approx(0.8 + 0.2 * 5)
    with pytest.raises(ValueError, match="ascending distinct sizes starting at 1"):
        CostCurve((2, 4), (1.0, 1.2))


class FakeModelRunner:
    """A model runner whose forward of n rows advances a fake clock by ``cost(n)``
    (behind a real ``SequenceRunner``, the RunnerView the cost model gets)."""

    vocab_size, block_size, num_blocks, max_model_len = 32, 4, 64, 256

    def __init__(self, seconds_per_call) -> None:
        self.now = 0.0
        self.seconds = seconds_per_call
        self.calls = []

    def forward(self, spans, want_hidden=False):
        (span,) = spans
        self.calls.append(len(span.token_ids))
        self.now += self.seconds(len(span.token_ids))
        return None

    def copy_blocks(self, pairs) -> None:
        assert not pairs


def test_measure_curve_times_each_size_and_gives_blocks_back():
    model = FakeModelRunner(lambda n: 0.010 + 0.001 * max(0, n - 4))
    runner = SequenceRunner(model)
    m = measure_curve(runner, max_rows=16, ctx=8, rounds=3, clock=lambda: model.now)
    curve = m.curve
    assert curve.sizes == (1, 2, 4, 8, 16)
    assert curve.ratios == pytest.approx((1.0, 1.0, 1.0, 1.4, 2.2))
    assert curve.t1_s == pytest.approx(0.010)
    assert m.agreed and m.num_passes == 2  # a quiet machine: the second pass confirms the first
    assert runner._blocks.num_free_blocks == 64  # its borrowed blocks are back
    assert model.calls[0] == 8 and model.calls.count(16) == 1 + 2 * 3  # prefix, warm-up, 2 passes of 3 rounds


def quiet(n):
    return 0.0074 * {1: 1.0, 2: 1.10, 4: 1.21, 8: 1.59, 16: 2.18}[n]


def load_by_pass(model, factors, rounds=3, sizes=5):
    """The quiet costs, with pass i's one-row forwards taking ``factors[i]`` times
    as long (1 prefix and ``sizes`` warm-up calls come first; later passes: the last
    factor). 4.3x is the run seen under CI load: t(1) 32 ms, the larger forwards looking free."""
    def seconds(n):
        timed = len(model.calls) - 1 - sizes - 1  # this call's index among the timed ones
        f = factors[min(max(timed, 0) // (rounds * sizes), len(factors) - 1)] if timed >= 0 else 1.0
        return quiet(n) * (f if n == 1 else 1.0)
    return seconds


def test_a_pass_distorted_by_load_is_not_trusted_until_two_passes_agree():
    model = FakeModelRunner(quiet)
    runner = SequenceRunner(model)
    model.seconds = load_by_pass(model, [4.3, 1.0, 1.0])
    m = measure_curve(runner, max_rows=16, ctx=8, rounds=3, clock=lambda: model.now)
    assert m.agreed and m.num_passes == 3  # pass 1 disagreed with pass 2; pass 3 agreed with pass 2
    assert m.curve.t1_s == pytest.approx(0.0074)
    assert m.curve.ratios == pytest.approx((1.0, 1.10, 1.21, 1.59, 2.18))


def test_passes_that_never_agree_give_a_curve_marked_not_agreed():
    model = FakeModelRunner(quiet)
    runner = SequenceRunner(model)
    model.seconds = load_by_pass(model, [1.0, 4.3, 1.0, 4.3])  # load comes and goes pass by pass
    m = measure_curve(runner, max_rows=16, ctx=8, rounds=3, max_passes=3, clock=lambda: model.now)
    assert not m.agreed and m.num_passes == 3


def test_curves_agree_within_the_tolerance_only():
    a = CostCurve((1, 2, 4), (1.0, 1.1, 1.2), t1_s=0.0074)
    assert curves_agree(a, CostCurve((1, 2, 4), (1.0, 1.15, 1.25), t1_s=0.008))
    assert not curves_agree(a, CostCurve((1, 2, 4), (1.0, 1.0, 1.0), t1_s=0.0074))  # the loaded shape
    assert not curves_agree(a, CostCurve((1, 2, 4), (1.0, 1.1, 1.2), t1_s=0.032))  # t(1) 4x apart
    assert not curves_agree(a, CostCurve((1, 2), (1.0, 1.1), t1_s=0.0074))


def test_only_an_agreed_measurement_is_cached(tmp_path):
    model = FakeModelRunner(quiet)
    runner = SequenceRunner(model)
    path = tmp_path / "cost" / "curve.json"
    src = CachedCurve(runner, path, {"model": "fake"}, 16, 8, clock=lambda: model.now)
    src.rounds = 3
    model.seconds = load_by_pass(model, [1.0, 4.3, 1.0])
    m = src.measure()
    assert not m.agreed and not path.exists()  # used by this process only
    model.seconds, model.calls = quiet, []
    m = src.measure()
    assert m.agreed and read_curve(path, {"model": "fake"}) == m.curve
    src.invalidate()
    assert not path.exists()


def test_the_watch_flags_a_curve_the_live_steps_beat():
    loaded = CostCurve((1, 2, 4, 8), (1.0, 1.0, 1.0, 1.92), t1_s=0.032)
    watch = CurveWatch(window=4)
    verdicts = [watch.observe(0.032 * loaded.cost(1), 0.0074) for _ in range(4)]
    assert verdicts == [None, None, None, "fast"] and watch.last_ratio == pytest.approx(0.0074 / 0.032)
    good = 0.0074 * 1.2  # t(4) of the quiet curve
    assert [watch.observe(good, good * f) for f in (0.9, 1.1, 3.0, 1.0)][-1] is None  # one slow step
    assert [watch.observe(good, good * 4) for _ in range(4)][-1] == "slow"  # load now: reported only
    with pytest.raises(ValueError, match="factors > 1"):
        CurveWatch(factor=1.0)


class FakeSource:
    def __init__(self, *measurements):
        self.measurements = list(measurements)
        self.invalidated = 0

    def measure(self):
        return self.measurements.pop(0)

    def invalidate(self):
        self.invalidated += 1


def test_a_flagged_curve_is_dropped_and_measured_again_at_idle():
    loaded = CostCurve((1, 2, 4), (1.0, 1.0, 1.0), t1_s=0.032)
    fresh = CostCurve((1, 2, 4), (1.0, 1.1, 1.2), t1_s=0.0074)
    src = FakeSource(Measurement(loaded, False, 3), Measurement(fresh, True, 2))
    cost = CostModel(loaded, source=src, origin="cache")
    assert not cost.remeasure_if_due()  # nothing flagged: nothing measured
    for _ in range(LIVE_WINDOW):
        cost.observe_forward(1, 0.0074)
    assert cost.remeasure_due and src.invalidated == 1  # the cache file goes at once
    assert not cost.remeasure_if_due() and cost.curve is loaded  # the machine was still busy: kept
    for _ in range(LIVE_WINDOW):
        cost.observe_forward(1, 0.0074)
    assert cost.remeasure_if_due() and cost.curve is fresh
    assert cost.describe()["cost_remeasurements"] == 2
    assert cost.describe()["cost_curve_origin"] == "measured again at an idle point"
    configured = CostModel(CostCurve.linear(0.1))
    for _ in range(LIVE_WINDOW):
        configured.observe_forward(1, 1e-6)
    assert not configured.remeasure_due  # a configured figure is never second-guessed


def test_draft_cost_is_learnt_from_step_timings_unless_configured():
    learnt = CostModel(CostCurve((1, 2), (1.0, 1.1), t1_s=0.01))
    assert learnt.draft_token_cost == 0.0
    learnt.observe_step(0.0, 0.002, 2, 0)  # no proposals: acceptance costs 1 ms a decode
    learnt.observe_step(0.004, 0.002, 2, 4)  # 1 ms a drafted token to propose, nothing more to accept
    assert learnt.draft_token_cost == pytest.approx(0.1)  # of a 10 ms forward
    learnt.observe_step(0.004, 0.006, 2, 4)  # and now 1 ms more a drafted token to accept
    assert learnt.draft_token_cost == pytest.approx(0.15)  # a plain mean over the first samples
    learnt.observe_step(1.0, 1.0, 0, 0)  # a step of prefills only: nothing learnt
    assert learnt.draft_token_cost == pytest.approx(0.15)
    fixed = CostModel(CostCurve((1, 2), (1.0, 1.1), t1_s=0.01), 0.5)
    fixed.observe_step(1.0, 0.0, 1, 1)
    assert fixed.draft_token_cost == 0.5


def decoding(request_id: str) -> Request:
    req = Request(request_id=request_id, prompt=None, prompt_token_ids=[1, 2], params=SamplingParams(), seed=0)
    req.token_ids, req.num_computed_tokens, req.status = [1, 2, 3], 2, RequestStatus.RUNNING
    return req


def test_policy_prices_drafts_with_the_curve():
    spec = SpeculativeConfig(proposer="ngram", num_speculative_tokens=8, draft_length={"policy": "adaptive",
                                                                                        "prior_acceptance": 0.7})
    flat_then_steep = CostCurve((1, 4, 5), (1.0, 1.0, 3.0))  # 3 extra rows free, the 4th costs 2 forwards
    policy = AdaptiveDraftLength(spec, CostModel(flat_then_steep, 0.0))
    assert policy.plan([decoding("r")]) == {"r": 3}
    # the proposer's own cost stops drafts the forward would carry for free
    costly = AdaptiveDraftLength(spec, CostModel(CostCurve.linear(0.0), 0.5))
    assert costly.plan([decoding("r")]) == {"r": 1}  # 0.7 / 0.5 > 1 / 1, then 0.49 / 0.5 < 1.7 / 1.5


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """The engine measures: no fixed figures, and a cache directory of its own.
    Passes count as agreeing whatever the machine's load (agreement has its own
    tests above), so these engine-level tests do not depend on a quiet CPU."""
    monkeypatch.setattr("speculant.engine.cost_model.curves_agree", lambda *a, **k: True)
    monkeypatch.delenv(TOKEN_COST_ENV, raising=False)
    monkeypatch.delenv(DRAFT_TOKEN_COST_ENV, raising=False)
    monkeypatch.setenv("SPECULANT_CACHE_DIR", str(tmp_path))
    return tmp_path / "cost"


def ngram_llm(llama_dir, **draft_length) -> LLM:
    return LLM(model=str(llama_dir), max_num_batched_tokens=64, max_num_seqs=4,
               speculative={"proposer": "ngram", "num_speculative_tokens": 3,
                            "draft_length": {"policy": "adaptive", **draft_length}})


def test_engine_measures_at_load_caches_and_remeasures_a_corrupt_cache(llama_dir, measuring):
    llm = ngram_llm(llama_dir)
    files = list(measuring.glob("*.json"))
    assert len(files) == 1, files
    stored = json.loads(files[0].read_text())
    assert stored["key"]["dtype"] == "float32" and stored["key"]["model"].endswith(llama_dir.name)
    m = llm.get_metrics()
    assert m["cost_curve"]["sizes"] == [1, 2, 4, 8, 16, 32] and m["cost_curve"]["ratios"][0] == 1.0
    assert m["draft_token_cost_source"] == "measured"
    # a second engine reads the file: the same curve, nothing rewritten
    mtime = files[0].stat().st_mtime_ns
    assert ngram_llm(llama_dir).get_metrics()["cost_curve"] == m["cost_curve"]
    assert files[0].stat().st_mtime_ns == mtime
    for junk in ("{not json", json.dumps({"key": stored["key"], "curve": {"sizes": [2], "ratios": [1]}})):
        files[0].write_text(junk)
        again = ngram_llm(llama_dir).get_metrics()["cost_curve"]
        assert again["sizes"] == [1, 2, 4, 8, 16, 32]
        assert json.loads(files[0].read_text())["curve"] == again  # rewritten whole
    out = llm.generate([[1, 2, 3, 1, 2, 3]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 6


def test_a_configured_figure_skips_the_measurement(llama_dir, measuring):
    m = ngram_llm(llama_dir, token_cost=0.1, draft_token_cost=0.0).get_metrics()
    assert not measuring.exists()
    assert m["cost_curve"] == {"sizes": [1, 2], "ratios": [1.0, 1.1], "t1_s": None}
    assert m["draft_token_cost_source"] == "config"


def test_a_bad_environment_figure_is_refused_by_name(llama_dir, monkeypatch):
    monkeypatch.setenv(TOKEN_COST_ENV, "fast")
    with pytest.raises(ValueError, match=r"SPECULANT_TOKEN_COST='fast' must be a number in \[0, 1\]"):
        ngram_llm(llama_dir)


def test_the_engine_measures_a_cached_curve_again_when_live_steps_beat_it(llama_dir, measuring):
    ngram_llm(llama_dir)
    (path,) = measuring.glob("*.json")
    stored = json.loads(path.read_text())
    stored["curve"] = {"sizes": [1, 2, 4], "ratios": [1.0, 1.0, 1.0], "t1_s": 10.0}  # "measured" under huge load
    path.write_text(json.dumps(stored))
    llm = ngram_llm(llama_dir)
    assert llm.get_metrics()["cost_curve"]["t1_s"] == 10.0
    out = llm.generate([[5, 9, 13, 2, 7, 11]], SamplingParams(max_tokens=3 * LIVE_WINDOW, temperature=0,
                                                               ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3 * LIVE_WINDOW
    m = llm.get_metrics()
    assert m["cost_remeasurements"] == 1 and m["cost_curve_live_ratio"] < 1 / 1.5
    if path.exists():  # the new passes agreed: cached again, with this machine's own t(1)
        assert json.loads(path.read_text())["curve"]["t1_s"] < 1.0
        assert m["cost_curve"]["t1_s"] < 1.0 and m["cost_curve"]["sizes"] == [1, 2, 4, 8, 16, 32]
