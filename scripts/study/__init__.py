"""The stale-data study behind ``scripts/stale_study.py``, one concept per module.

* ``arms.yaml`` / :mod:`study.arms`   - the method matrix and the default settings, as data
* :mod:`study.runs`                   - a run's name, directory layout and files
* :mod:`study.scheduler`              - resumable scheduling of ``python -m areal_m2po.train``
* :mod:`study.summary`                - the numbers (per run, per arm, paired to on-policy)
* :mod:`study.verdicts`               - the paper's claims judged from paired differences
* :mod:`study.figure`, :mod:`study.report` - PNG, CSV and Markdown from the run directories
* :mod:`study.length_probe`           - new tokens a correct answer needs (max_new_tokens)
"""
