"""Detokenization cost per output token: stop strings + streaming, old vs new.

For one request with two stop strings that never occur and streaming on
(``LLMEngine.stream_text``), each engine step appends a run of tokens (1 per
step without speculation, 5 with k = 4 fully accepted) and then shows the
request's stable text. Two ways of doing that detokenization work:

* ``full_decode`` (the engine before issue 14, rebuilt here as the baseline):
  after every token decode the whole output and search each stop string in
  it; after every step decode the whole output again for the streamed text.
  O(length) per token.
* ``incremental`` (``speculant/engine/detokenizer.py``, through the engine's own
  ``append_tokens`` / ``catch_up`` / ``Detokenizer.stable_text``): decode a
  window of a few tokens, search only the new text. O(1) per token.

The outputs are real text: token ids of Python standard-library source under
the benchmark tokenizer (``bench_models.py``: byte-level BPE, ~20.9k tokens), cut at
a few fixed offsets. Both ways must give the same streamed texts (checked).
Reported: median microseconds per output token over the cuts and repetitions,
and decoded tokens per output token. No model is involved.

    python benchmarks/detokenize_bench.py            # -> results/detokenize.json
    python benchmarks/detokenize_bench.py --quick    # shorter outputs, one repetition
"""

from __future__ import annotations

import statistics
import time

import harness
from bench_models import DEFAULT_CACHE_DIR, cached_tokenizer, corpus_texts
from speculant.config.sampling_params import SamplingParams
from speculant.engine.detokenizer import REPLACEMENT, TextDecoder
from speculant.engine.request import Request, RequestStatus
from speculant.engine.stop_rules import append_tokens, catch_up

STOPS = ["\nclass Zyzzyva", "<|never|>"]  # absent from the corpus: every output runs to full length
HOLD = max(len(s) for s in STOPS) - 1


class Counting:
    """``tokenizer.decode(ids, skip_special_tokens=True)`` that counts decoded tokens."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.tokens = tokenizer, 0

    def __call__(self, ids: list[int]) -> str:
        self.tokens += len(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=True)


def new_request(length: int) -> Request:
    params = SamplingParams(max_tokens=length, ignore_eos=True, stop=STOPS)
    return Request("bench", None, [1], params, seed=0)


def full_decode(ids: list[int], run: int, decode: Counting) -> list[str]:
    """The old stop rules and streamed text: the whole output decoded after every token and every step."""
    req, shown = new_request(len(ids)), []
    for i in range(0, len(ids), run):
        for tok in ids[i: i + run]:
            req.token_ids.append(tok)
            text = decode(req.output_token_ids)
            if any(text.find(stop) != -1 for stop in STOPS):
                raise AssertionError("a stop string occurred; pick others")
        text = decode(req.output_token_ids).rstrip(REPLACEMENT)
        shown.append(text[: max(0, len(text) - HOLD)])
    return shown


def incremental(ids: list[int], run: int, decode: Counting, skip_ids: frozenset[int]) -> list[str]:
    decoder, req, shown = TextDecoder(decode, skip_ids), new_request(len(ids)), []
    for i in range(0, len(ids), run):
        append_tokens(req, ids[i: i + run], 10**9, decoder)
        if req.status is RequestStatus.FINISHED and req.finish_reason != "length":
            raise AssertionError("a stop string occurred; pick others")
        catch_up(req, decoder)  # what planning does for streaming
        shown.append(req.detokenizer.stable_text(HOLD))
    return shown


def measure(fn, ids, run, decode, repeat: int, *extra) -> tuple[list[float], float, list[str]]:
    """Seconds per output token of each repetition, decoded tokens per output token, streamed texts."""
    times = []
    for _ in range(repeat):
        decode.tokens = 0
        t0 = time.perf_counter()
        shown = fn(ids, run, decode, *extra)
        times.append((time.perf_counter() - t0) / len(ids))
    return times, decode.tokens / len(ids), shown


def main() -> None:
    ap = harness.arg_parser(__doc__, out=harness.RESULTS_DIR / "detokenize.json", repeats=7,
                           quick="outputs of 64 and 256 tokens, one repetition", cache_dir=DEFAULT_CACHE_DIR)
    ap.add_argument("--lengths", default="128,512,2048")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    repeat = args.repeats
    if args.quick:
        lengths, repeat = [64, 256], 1
    bench = harness.start("detokenize", args)
    tokenizer = cached_tokenizer(args.cache_dir)
    skip_ids = TextDecoder.for_tokenizer(tokenizer).skip_ids
    corpus = tokenizer("\n".join(corpus_texts()), add_special_tokens=False)["input_ids"]
    offsets = [len(corpus) * i // 4 for i in range(3)]
    decode = Counting(tokenizer)
    results, rows = [], []
    for length in lengths:
        for run in (1, 5):
            row = {"output_tokens": length, "tokens_per_step": run}
            for name, fn, extra in (("full_decode", full_decode, ()), ("incremental", incremental, (skip_ids,))):
                samples, decoded, texts = [], [], []
                for off in offsets:
                    ids = corpus[off: off + length]
                    t, d, shown = measure(fn, ids, run, decode, repeat, *extra)
                    samples += t
                    decoded.append(d)
                    texts.append(shown)
                row[name] = {"us_per_token": round(statistics.median(samples) * 1e6, 2),
                             "us_per_token_samples": [round(x * 1e6, 2) for x in samples],
                             "decoded_tokens_per_token": round(statistics.mean(decoded), 2)}
                row.setdefault("_texts", []).append(texts)
            old_texts, new_texts = row.pop("_texts")
            assert old_texts == new_texts, "the incremental streamed text differs from the full decode's"
            row["speedup"] = round(row["full_decode"]["us_per_token"] / row["incremental"]["us_per_token"], 1)
            results.append(row)
            rows.append([length, run, row["full_decode"]["us_per_token"], row["incremental"]["us_per_token"],
                         f'{row["speedup"]}x', row["full_decode"]["decoded_tokens_per_token"],
                         row["incremental"]["decoded_tokens_per_token"]])
            print(rows[-1], flush=True)
    bench.write({"stop_strings": STOPS, "cuts": len(offsets), "repeat": repeat,
                 "tokenizer": f"byte-level BPE, {len(tokenizer)} tokens (benchmarks/bench_models.py)",
                 "results": results})
    print(harness.markdown_table(["output tokens", "tokens/step", "full decode µs/token", "incremental µs/token",
                                 "speedup", "decoded tok/token (full)", "decoded tok/token (incr.)"], rows))


if __name__ == "__main__":
    main()
