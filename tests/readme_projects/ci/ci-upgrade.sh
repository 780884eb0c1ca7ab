# The baseline was recorded on an older torch, before the pull request's break.
pytest -q --nobreak-update-baseline
sed -i 's/"torch": "[^"]*"/"torch": "2.12.0"/' tests/nobreak-baseline.json
cp pr/models.py models.py
