"""The configuration layer: the pydantic config models, sampling parameters,
the compatibility rules every combination of plugins is checked against, and
the matrix those rules produce. Imports the contract and the plugin registry,
nothing that runs a model."""
