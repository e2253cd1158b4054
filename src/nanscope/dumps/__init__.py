"""slime's debug dumps: the one reader and the one writer of each format, and the scan's checks over them.

io.py            the reader (`load`, `load_rollout`): unpickler.py (restricted loader), rollout_dump.py and
                 train_dump.py (each format's samples), fields.py (field checks), dump.py (Dump, SampleData)
writers.py       the writer of each format; demo.py builds the synthetic dumps tests and --write-demo write
checks.py        the check table and `scan`: sample_checks.py, group_checks.py, collector.py, verdict.py,
                 result.py (what a scan finds), flags.py (the slime flags it checks against)
formats.py, limits.py, many.py (directories)
"""
