# The pull request adds a test without recording it.
pytest -q --nobreak-update-baseline
cp pr/test_new.py tests/test_new.py
