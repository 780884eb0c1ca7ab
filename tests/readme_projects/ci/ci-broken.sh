# A hand edit (a float) in one copy of the baseline, a merge conflict left in another.
pytest -q --nobreak-update-baseline
python - <<'PY'
import pathlib
text = pathlib.Path("tests/nobreak-baseline.json").read_text()
mlp = text.index('"tests/test_models.py::test_mlp"')
graphs = text.index('"graphs": 1', mlp)
edited = text[:graphs] + '"graphs": 1.5' + text[graphs + len('"graphs": 1'):]
pathlib.Path("tests/edited-baseline.json").write_text(edited)
lines = text.splitlines(keepends=True)
conflict = lines[:13] + ["<<<<<<< HEAD\n"] + lines[13:15] + ["=======\n", ">>>>>>> pr\n"] + lines[15:]
pathlib.Path("tests/merged-baseline.json").write_text("".join(conflict))
PY
