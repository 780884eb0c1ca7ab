# tests/ run in two steps, each with its own report.
cp pr/test_unit.py tests/test_unit.py
pytest -q tests/test_unit.py --nobreak-json unit.json
pytest -q tests/test_models.py --nobreak-json models.json
