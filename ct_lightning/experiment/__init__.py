"""The experiment layer: the only part of ct_lightning that knows MLflow and the data registry.

``settings`` (the table of training settings), ``data`` (building data modules), ``train`` (one
tracked training run), ``runs`` (loading trained runs), ``checkpoints``, ``tracking`` and
``consistency`` (the RS/LOO experiment); ``validation`` (value rules, one-line errors, checks of files,
stores and devices), ``preflight`` (every check of a training before anything is created) and
``catalogue`` (registry names and defaults read from the source, so command lines start without torch);
``options`` (every recipe's options from rows), ``runner`` (parse, one-line errors, the store) and
``workflows`` (one module per recipe), ``atomic_files`` (result files written whole).
Import the submodules you need.
"""
