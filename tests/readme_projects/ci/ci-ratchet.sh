# The baseline was recorded with the break; the pull request removes it.
cp models.py clean.py
cp pr/models.py models.py
pytest -q --nobreak-update-baseline
mv clean.py models.py
