# The first recording of the suite's baseline.
pytest -q --nobreak-update-baseline
