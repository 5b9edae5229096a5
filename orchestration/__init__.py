"""The top floor: runs the pipeline that ``stages/`` defines, on ``pipeline/`` and ``model/``.

The Prefect flow and its deployment (``flows``, ``deploy``), DVC's public interfaces as the
flow uses them (``dvc_access``) and ``key=value`` parameter overrides (``overrides``).
Nothing below imports this package: stages, the model and the CLIs run without Prefect.
"""
