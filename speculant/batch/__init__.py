"""``speculant batch``: run a JSONL file of prompts to a JSONL file of answers.

``lines`` (an input line -> a request, or the reason it cannot run),
``output`` (the output file: resume, records written in input order),
``runner`` (one engine working through lines, as many in flight as it
batches), ``ray_job`` (the same job over Ray Data, one engine per actor).
"""
