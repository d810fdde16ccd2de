"""The recipes' workflows, one module each (``recipes/X.py`` parses its command line and runs ``workflows.X.run``).

Each ``run(args)`` checks its inputs (``with runner.checking():``) before torch, Lightning or MLflow is imported,
then does the work and prints what the user acts on; importing a module here imports none of them.
"""
