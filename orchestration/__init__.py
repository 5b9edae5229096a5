"""The top floor: runs the pipeline that ``stages/`` defines, on ``pipeline/`` and ``model/``.

The Prefect flow and its deployment (``flows``, ``deploy``), DVC's public interfaces as the
flow uses them (``dvc_access``), ``key=value`` parameter overrides (``overrides``), the checks
made before any stage runs (``checks``: every params section, a Dask scheduler) and what
Ctrl-C does during a one-off run (``interrupt``).
Nothing below imports this package: stages, the model and the CLIs run without Prefect.
"""
