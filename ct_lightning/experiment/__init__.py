"""The experiment layer: the only part of ct_lightning that knows MLflow and the data registry.

Five layers, lowest first; a module imports only from its own layer or lower ones (tests/test_imports.py):

- ``configuration/``: the settings table and its roles, options, value rules and one-line errors, the tracking
  store's name and checks (``store``), start-up checks (``preflight``), building data modules (``data``);
- ``runs/``: one MLflow run: training, loading, checkpoints, the outbox for server outages, served models;
- ``studies/``: many runs: reproductions, appendix grids, sweeps, consistency;
- ``runner``: the recipes' one runner (parsing, one-line errors, the store, console entries);
- ``workflows/``: one module per recipe.

Import the submodules you need.
"""
