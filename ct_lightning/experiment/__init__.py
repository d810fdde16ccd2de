"""The experiment layer: the only part of ct_lightning that knows MLflow and the data registry.

``settings`` (the table of training settings), ``data`` (building data modules), ``train`` (one
tracked training run), ``runs`` (loading trained runs), ``checkpoints``, ``tracking`` and
``consistency`` (the RS/LOO experiment). Import the submodules you need.
"""
