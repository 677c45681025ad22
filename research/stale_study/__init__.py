"""The stale-data study (``python -m research.stale_study --round N``), one concept per module.

* ``arms.yaml`` / :mod:`.arms`      - the method matrix and the settings every round shares
* ``rounds/roundN.yaml`` / :mod:`.rounds` - a round: its plan, claims, verdict rules, report
* :mod:`.cli`                       - the command line: run (or resume) a round, then report
* :mod:`.runs`                      - a run's name, directory layout and files
* :mod:`.scheduler`                 - resumable scheduling of ``python -m areal_m2po.train``
* :mod:`.summary`                   - the numbers (per run, per arm, paired differences)
* :mod:`.verdicts`                  - a round's claims judged by its rules
* :mod:`.report`, :mod:`.tables`, :mod:`.figure` - Markdown, CSV and PNG from the run directories
* :mod:`.length_probe`              - new tokens a correct answer needs (max_new_tokens)

``data/runs/`` holds every finished run's small files (the reports read nothing else),
``data/pilot_r3/`` round 3's unfinished staleness pilot; the reports are in ``docs/``.
"""
