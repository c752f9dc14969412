"""The engine layer: requests, the token-budget scheduler, the step pipeline
(propose -> score -> accept -> commit), sampling, stop rules, detokenizing and
the engine loop (``LLMEngine``)."""
