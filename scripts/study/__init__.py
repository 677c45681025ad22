"""The stale-data study behind ``scripts/stale_study.py``, one concept per module.

* ``arms.yaml`` / :mod:`study.arms`   - the method matrix and the default settings, as data
* :mod:`study.runs`                   - a run's name, directory layout and files
* :mod:`study.scheduler`              - resumable scheduling of ``python -m areal_m2po.train``
* :mod:`study.summary`                - the numbers (per run, per arm, paired to on-policy)
* :mod:`study.report`                 - CSV, PNG and Markdown written from the run directories
"""
